"""heavylift retire: take a deployment off hosts cleanly.

    pyinfra inventory/<site>.py retire.py --data retire=kimi --dry      list what would go and what stays
    pyinfra -y inventory/<site>.py retire.py --data retire=kimi         do it (add --limit HOST for some hosts)

Stops and disables the service (systemd, or the start-stop-daemon fallback), removes its unit,
the deployment's folder (releases, overlay, launcher, private secrets, status, logs) and the
venvs and snapshots only this deployment used; keeps every venv and snapshot another
deployment on the host uses. Takes the host lock like a deploy. The deployment is read from the
host's own folders, so a deployment the site no longer names can be retired too; a deployment
the site still names on that host comes back with the next ``deploy.py`` run: remove it from the
site as well.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pyinfra import host, logger, state

from models.errors import HeavyliftConfigError
from models.schema import SLUG, SiteSettings
from operations import fleet, hostlock, retire
from resolve.context import RunContext
from resolve.layout import Layout

layout = Layout.of_host(host.data.get("root"))
name = host.data.get("retire")
if not name or not SLUG.match(str(name)):
    raise HeavyliftConfigError(
        f"retire.py, host '{host.name}': field 'retire' ({name!r}) does not name a deployment. "
        "Fix: --data retire=<deployment name>, e.g. --data retire=kimi. No host was changed."
    )
found = host.get_fact(fleet.HostState, root=layout.root)
if name not in found["deployments"]:
    raise HeavyliftConfigError(
        f"retire.py, host '{host.name}': field 'retire': deployment {name!r} is not on this host (under "
        f"{layout.deployments_dir}: {', '.join(found['deployments']) or 'none'}). Fix: name one of those, or leave "
        "this host out with --limit. No host was changed."
    )
plan = retire.plan_retire(found, name)
for line in plan.lines():
    logger.info(f"{host.print_prefix}{line}")

hostlock.hold(host, state, layout.lock, dry=RunContext.of_pyinfra(state, host).dry)
# the account its vLLM ran as: the site's, else the schema's default (ranks of that user are ended with the service)
user = host.data.get("service_user") or SiteSettings.model_fields["service_user"].default
retire.retired(name=f"retire deployment {name}", plan=plan, user=user)
# given back like a deploy's (it was left held: the next run said "recovered a stale lock")
hostlock.released(name="deploy lock given back", path=layout.lock)
