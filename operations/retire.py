"""Retire: a deployment taken off a host cleanly, keeping what another deployment still uses.

What goes: the service (stopped, disabled, its unit removed; or the fallback's process stopped),
the deployment's folder (releases, overlay, launcher, private secrets, status, logs), and the
venvs and snapshots that only this deployment's releases use. What stays: every venv and
snapshot that another deployment's staging links or kept releases use, the Hub client venv,
uv and the uv cache. The plan is a pure function of the host's state (``fleet.HostState``).
retire.py's steps: ``planned`` (the deployment named, read from the host), ``reported``, ``removed``.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from pyinfra import host, logger, state
from pyinfra.api import QuoteString, StringCommand, operation

from models.errors import HeavyliftConfigError
from models.schema import SLUG, SiteSettings
from resolve.context import RunContext
from resolve.layout import Layout
from resolve.supervisor import SYSTEMD
from resolve.weights import human_bytes

from . import fleet, supervisor


@dataclass(frozen=True)
class RetirePlan:
    deployment: str
    folder: str
    service: dict  # the service as the host's state has it: its supervisor, read back from the host
    layout: Layout
    remove: list[tuple[str, str]] = field(default_factory=list)  # (path, what it is)
    keep: list[tuple[str, str]] = field(default_factory=list)  # (path, why it stays)
    freed_bytes: int = 0
    user: str | None = None  # the service user its vLLM ran as (its processes end with the service)

    def lines(self) -> list[str]:
        lines = [f"retire {self.deployment}: stop the service ({self.service.get('manager')}, now {self.service.get('state')})"]
        lines += [f"retire {self.deployment}: remove {path} ({what})" for path, what in self.remove]
        lines += [f"retire {self.deployment}: keep {path} ({why})" for path, why in self.keep]
        lines.append(f"retire {self.deployment}: frees about {human_bytes(self.freed_bytes)} of snapshots")
        return lines


def _uses(deployment: dict) -> tuple[set[str], set[str]]:
    """The venvs and snapshots a deployment's staging links and kept releases use."""
    venvs = {r["venv"] for r in deployment["releases"] if r.get("venv")}
    snapshots = {r["snapshot"] for r in deployment["releases"] if r.get("snapshot")}
    staging = deployment.get("staging") or {}
    venvs |= {staging["venv"]} if staging.get("venv") else set()
    snapshots |= {staging["snapshot"]} if staging.get("snapshot") else set()
    return {v.rstrip("/") for v in venvs}, snapshots


def planned() -> tuple[RetirePlan, RunContext]:
    """This host's retire plan (``--data retire=<deployment>``) and the run's context. A name that is not a
    deployment on the host is refused, naming what is there, before any host changes."""
    context = RunContext.of_pyinfra(state, host)
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
    # the account its vLLM ran as: the site's, else the schema's default (ranks of that user are ended with the service)
    user = host.data.get("service_user") or SiteSettings.model_fields["service_user"].default
    return plan_retire(found, name, user), context


def reported(plan: RetirePlan) -> None:
    """What goes and what stays (every run, also --dry)."""
    for line in plan.lines():
        logger.info(f"{host.print_prefix}{line}")


def removed(plan: RetirePlan):
    """The retire stage: the service stopped, the deployment's folder, unit and what only it used removed."""
    return retired(name=f"retire deployment {plan.deployment}", plan=plan, user=plan.user)


def plan_retire(state: dict, name: str, user: str | None = None) -> RetirePlan:
    """What retiring ``name`` removes and keeps on the host whose state this is. KeyError if absent.
    ``user``: the service user its vLLM ran as."""
    target = state["deployments"][name]
    venvs, snapshots = _uses(target)
    others: dict[str, str] = {}
    for other, deployment in state["deployments"].items():
        if other == name:
            continue
        for path in set().union(*_uses(deployment)):
            others.setdefault(path, other)
    layout = Layout.of_host(state["root"]).of(name)
    folder = layout.deployment_dir
    remove = [(folder, "releases, overlay, launcher, private secrets, status, logs")]
    keep = []
    sizes = {s["path"]: s["bytes"] for s in state["snapshots"]}
    freed = 0
    for path in sorted(venvs):
        if path in others:
            keep.append((path, f"venv deployment {others[path]} uses"))
        elif posixpath.isabs(path) and posixpath.dirname(path) == layout.venvs_dir:
            remove.append((path, "venv only this deployment used"))
    for path in sorted(snapshots):
        if path in others:
            keep.append((path, f"snapshot deployment {others[path]} uses"))
        elif path in sizes:
            remove += [(path, f"snapshot only this deployment used, {human_bytes(sizes[path])}"),
                       (path + ".manifest.*", "its manifest, lock and download request")]
            freed += sizes[path]
    service = dict(target["service"])
    if service.get("manager") == SYSTEMD:
        remove.append((layout.unit_path, "systemd unit"))
    return RetirePlan(name, folder, service, layout, remove, keep, freed, user)


@operation()
def retired(plan: RetirePlan, user: str, grace_seconds: int = 60):
    """
    A deployment gone from the host: service stopped (and disabled), its folder, unit and the venvs
    and snapshots only it used removed.

    + plan: from ``plan_retire`` (the host's state at prepare time)
    + user: the service user its vLLM ran as: any process of it left from the deployment ends with the service
    + grace_seconds: how long the fallback's stop waits after SIGTERM before SIGKILL
    """
    # the supervisor it runs under, as the host's state says: the one planning decided when it was deployed
    running = supervisor.of(plan.layout, plan.service.get("manager"), user, grace_seconds)
    if running.manager == SYSTEMD or plan.service.get("pid"):
        yield from running.retire_stop
    # no rank left behind: the deployment's processes that outlived the stop, and their /dev/shm segments
    yield running.reap
    for path, _ in plan.remove:
        if path.endswith(".manifest.*"):  # the files beside a snapshot: a glob, outside the quotes
            yield StringCommand("rm", "-rf", StringCommand(QuoteString(path[: -len(".manifest.*")]), ".manifest.*", _separator=""))
        else:
            yield StringCommand("rm", "-rf", QuoteString(path))
    yield from running.after_removal
