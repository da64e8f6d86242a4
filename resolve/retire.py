"""Retire: what taking a deployment off a host removes and what stays, decided from the host's state
(``fleet.HostState``); operations/retire.py reads that state and removes what the plan says.

What goes: the service (stopped, disabled, its unit removed; or the fallback's process stopped),
the deployment's folder (releases, overlay, launcher, private secrets, status, logs), and the
venvs and snapshots that only this deployment's releases use. What stays: every venv and
snapshot that another deployment's staging links or kept releases use, the Hub client venv,
uv and the uv cache.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from .layout import Layout
from .supervisor import SYSTEMD
from .weights import human_bytes


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
    # the site source's server, as the host's state has it, when it goes with this, the host's last deployment
    site_source: dict | None = None

    def lines(self) -> list[str]:
        lines = [f"retire {self.deployment}: stop the service ({self.service.get('manager')}, now {self.service.get('state')})"]
        if self.site_source:
            lines.append(f"retire {self.deployment}: stop the site source ({self.site_source.get('manager')}, now "
                         f"{self.site_source.get('state')}): no deployment is left on this host")
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
    # the host is its site's source (operations/sitesource.py): its server serves the host's snapshots to the other
    # hosts while a deployment is here; with the last one gone it would serve what is left, forever. A deploy that
    # needs it again starts it again
    site_source, staying = state.get("site_source"), sorted(set(state["deployments"]) - {name})
    if site_source and staying:
        keep.append((layout.site_source.folder, f"the site source's server: deployment {staying[0]} is still here"))
        site_source = None
    elif site_source:
        remove.append((layout.site_source.folder, "the site source's server: launcher, token, log"))
        if site_source.get("manager") == SYSTEMD:
            remove.append((layout.site_source.unit_path, "the site source's systemd unit"))
    return RetirePlan(name, folder, service, layout, remove, keep, freed, user, site_source or None)
