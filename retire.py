"""heavylift retire: take a deployment off hosts cleanly.

    pyinfra inventory/<site>.py retire.py --data retire=kimi --dry      list what would go and what stays
    pyinfra -y inventory/<site>.py retire.py --data retire=kimi         do it (add --limit HOST for some hosts)

Stops and disables the service (systemd, or the start-stop-daemon fallback), removes its unit,
the deployment's folder (releases, overlay, launcher, private secrets, status, logs) and the
venvs and snapshots only this deployment used; keeps every venv and snapshot another
deployment on the host uses. On a site's source host, the last deployment takes the site source's
server with it. Takes the host lock like a deploy. The deployment is read from the
host's own folders, so a deployment the site no longer names can be retired too; a deployment
the site still names on that host comes back with the next ``deploy.py`` run: remove it from the
site as well.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pyinfra import host, state

from operations import hostlock, retire

# the deployment named by --data retire=<name>, read from the host's own folders -> what goes and what stays,
# or a refusal naming what the host has before any host changes
plan, context = retire.planned()
retire.reported(plan)
# one run at a time per host: the lock is taken before the first change and given back after the last
hostlock.with_lock(host, state, plan.layout.lock, context.dry, lambda: retire.removed(plan))
