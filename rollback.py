"""heavylift rollback: put a kept release back on chosen hosts, through the readiness gate.

    pyinfra -y inventory/<site>.py rollback.py                           previous release, every host
    pyinfra -y inventory/<site>.py rollback.py --limit gpu-node-1        one host
    pyinfra -y inventory/<site>.py rollback.py --data release=3f2a9c     a named kept release (id or prefix)
    pyinfra inventory/<site>.py rollback.py --dry                         say what would happen, change nothing

The site files are not changed: ``current`` moves to the chosen release (``previous`` to the one it
replaces), the service restarts, and the same readiness gate as a deploy checks it (/health, a
completion, the decode benchmark; ``status.json`` and the report line name the release). A
release that fails the gate is switched back to the one that served before and the run fails.

The site still describes the release it had: the next ``deploy.py`` run converges the host back to
it (a new switch and restart). Roll back, then fix the site (or the lock file) before the next run.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pyinfra import host, state

from operations import hostlock, rollback, rollout

# the site and the kept release's record (read back from the host) -> this host's rollback plan, or a refusal
# naming the field and what the host keeps before any host changes (resolve/rollback.py)
plan, context = rollback.planned()
rollback.reported(plan)


def rollback_stages():
    """A deploy's switch, service and gate stages (operations/rollout.py) with the rollback's parts."""
    switched = rollout.release_switched(plan)
    supervisor, _ = rollout.service_running(plan, [switched])
    rollout.gate_passed(plan, supervisor, [switched])


# one run at a time per host: the lock is taken before the first change and given back after the last
hostlock.with_lock(host, state, plan.layout.lock, context.dry, rollback_stages)
