"""heavylift: bring a model up with vLLM on every host of the inventory.

    pyinfra inventory/<site>.py deploy.py                        converge
    pyinfra inventory/<site>.py deploy.py --dry --diff           show what would change
    pyinfra inventory/<site>.py deploy.py --data until=prepare   everything but the switch, restart and gate

The rollout, top to bottom: validate and plan (resolve/, no host changes) -> runtime -> weights ->
overlay -> release -> switch -> service -> readiness gate. One call per stage (operations/rollout.py),
each taking its part of the plan.
"""

import sys
from pathlib import Path

# models/, resolve/ and operations/ live beside this file, wherever pyinfra is started from
sys.path.insert(0, str(Path(__file__).resolve().parent))

from operations import rollout

# validate and plan: the run's context, the site's data, its secrets, the host's facts -> one frozen plan,
# or a refusal naming file and field before any host changes
plan, context = rollout.planned()
rollout.report_resolution(plan)
rollout.lock_taken(plan.layout, context)

stale = rollout.runtime_converged(plan)
host_state, snapshots_before = rollout.weights_present(plan)
stale += rollout.overlay_rendered(plan)
stale += rollout.release_staged(plan)
if plan.until == "serve":
    stale.append(rollout.release_switched(plan, host_state, snapshots_before))
rollout.readable(plan)
if plan.until == "serve":
    supervisor, service = rollout.service_running(plan, stale)
    rollout.gate_passed(plan, supervisor, [*stale, service])
rollout.lock_given_back(plan.layout)
