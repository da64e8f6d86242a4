"""Retire: a deployment taken off a host cleanly, keeping what another deployment still uses.

What goes and what stays is planned from the host's state (``fleet.HostState``) in resolve/retire.py.
retire.py's steps: ``planned`` (the deployment named, read from the host), ``reported``, ``removed``.
"""

from __future__ import annotations

from pyinfra import host, logger, state
from pyinfra.api import QuoteString, StringCommand, operation

from models.errors import HeavyliftConfigError
from models.schema import SLUG
from models.validate import operator_settings
from resolve.context import RunContext
from resolve.layout import Layout
from resolve.retire import RetirePlan, plan_retire
from resolve.supervisor import SYSTEMD

from . import fleet, supervisor


def planned() -> tuple[RetirePlan, RunContext]:
    """This host's retire plan (``--data retire=<deployment>``) and the run's context. A name that is not a
    deployment on the host is refused, naming what is there, before any host changes."""
    context = RunContext.of_pyinfra(state, host)
    # the two site fields retire reads, checked as deploy.py checks them; the rest of the site is not its business
    settings = operator_settings(host, ["root", "service_user"])
    layout = Layout.of_host(settings["root"])
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
    # the account its vLLM ran as (ranks of that user are ended with the service)
    return plan_retire(found, name, settings["service_user"]), context


def reported(plan: RetirePlan) -> None:
    """What goes and what stays (every run, also --dry)."""
    for line in plan.lines():
        logger.info(f"{host.print_prefix}{line}")


def removed(plan: RetirePlan):
    """The retire stage: the service stopped, the deployment's folder, unit and what only it used removed."""
    return retired(name=f"retire deployment {plan.deployment}", plan=plan, user=plan.user)


@operation()
def retired(plan: RetirePlan, user: str, grace_seconds: int = 60):
    """
    A deployment gone from the host: service stopped (and disabled), its folder, unit and the venvs
    and snapshots only it used removed.

    + plan: from resolve/retire.py ``plan_retire`` (the host's state at prepare time)
    + user: the service user its vLLM ran as: any process of it left from the deployment ends with the service
    + grace_seconds: how long the fallback's stop waits after SIGTERM before SIGKILL
    """
    # the supervisor it runs under, as the host's state says: the one planning decided when it was deployed
    running = supervisor.of(plan.layout, plan.service.get("manager"), user, grace_seconds)
    if running.manager == SYSTEMD or plan.service.get("pid"):
        yield from running.retire_stop
    # no rank left behind: the deployment's processes that outlived the stop, and their /dev/shm segments
    yield running.reap
    if plan.site_source:  # the host's last deployment goes: the site source's server with it, before its files
        yield from supervisor.site_source_stop(plan.layout.site_source, plan.site_source.get("manager"))
    for path, _ in plan.remove:
        if path.endswith(".manifest.*"):  # the files beside a snapshot: a glob, outside the quotes
            yield StringCommand("rm", "-rf", StringCommand(QuoteString(path[: -len(".manifest.*")]), ".manifest.*", _separator=""))
        else:
            yield StringCommand("rm", "-rf", QuoteString(path))
    yield from running.after_removal
    if plan.site_source and plan.site_source.get("manager") == SYSTEMD and running.manager != SYSTEMD:
        yield StringCommand("systemctl", "daemon-reload", "2>/dev/null", "||", "true")
