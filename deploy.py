"""heavylift: bring a model up with vLLM on every host of the inventory.

    pyinfra inventory/<site>.py deploy.py                        converge
    pyinfra inventory/<site>.py deploy.py --dry --diff           show what would change
    pyinfra inventory/<site>.py deploy.py --data until=prepare   everything but the switch, restart and gate

The rollout, top to bottom: validate and plan (resolve/, no host changes) -> the disk check -> runtime -> weights ->
overlay -> release -> switch -> service -> readiness gate (the last three in waves where the site sets
wave_size or max_unavailable). One call per stage (operations/rollout.py),
each taking its part of the plan.
"""

import sys
from pathlib import Path

# models/, resolve/ and operations/ live beside this file, wherever pyinfra is started from
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pyinfra import host, state

from operations import argtypes, factbatch, hostlock, oporder, rollout, waves

# the facts this host's last run read, read again in one round trip each time the run changed the host
# (operations/factbatch.py): a converged re-run makes one round trip instead of fifty
factbatch.activate(host)
# pyinfra's operation order without reading the source of every frame per operation (operations/oporder.py)
oporder.activate()
# pyinfra's global arguments from their type hints once, not once per operation and fact read (operations/argtypes.py)
argtypes.activate()

# validate and plan: the run's context, the site's data, its secrets, the host's facts -> one frozen plan,
# or a refusal naming file and field before any host changes
plan, context = rollout.planned()
# the fleet's waves (wave_size / max_unavailable): one size per deployment, checked across the hosts here
wave_plan = waves.planned(host, context)
rollout.report_resolution(plan)


def rollout_stages():
    """runtime -> weights -> overlay -> release, then the switch, restart and gate: on every host at once, or
    wave by wave (wave_size / max_unavailable, operations/waves.py); a wave is held, untouched, once any host
    of the run has failed."""
    stale = rollout.runtime_converged(plan)
    host_state, snapshots_before = rollout.weights_present(plan, disk)
    stale += rollout.overlay_rendered(plan)
    stale += rollout.release_staged(plan)
    rollout.readable(plan)
    if plan.until != "serve":
        return
    for wave in waves.rolling(host, state, wave_plan):
        switched = rollout.release_switched(plan, host_state, snapshots_before)
        supervisor, service = rollout.service_running(plan, [*stale, switched])
        gate = rollout.gate_passed(plan, supervisor, [*stale, switched, service])
        rollout.wave_rolled_back(wave_plan, wave, switched, gate)


# the disk check of the weights, before any change: a host whose disk cannot hold the checkpoint holds the whole
# run, or is left untouched and failed while the others go on (when_disk_too_small)
disk = rollout.disk_checked(plan)
if disk.refusal:
    rollout.refused(plan, disk, wave_plan)
else:
    # one run at a time per host: the lock is taken before the first change and given back after the last
    hostlock.with_lock(host, state, plan.layout.lock, context.dry, rollout_stages)
