"""Disks that don't fill: which snapshots no kept release needs, with the releases beyond the keep count, a deploy
removes; decided from the host's state (``fleet.HostState``). operations/diskgc.py removes them.

Moving a 540 GB checkpoint to a new revision twice would leave three copies. Each deploy run
removes, on the host it converges:

- every complete snapshot (``<root>/models/<org>--<name>/<commit>/`` with its manifest) that no
  kept release and no staging overlay of any deployment on the host references;
- this deployment's snapshots beyond ``keep_snapshots`` (newest kept releases first), together
  with the kept releases that need them (a release without its weights cannot be rolled back to).

Never one that ``current`` or ``previous`` of any deployment uses, nor the one this run deploys, nor
a snapshot without a manifest (a download to resume). The removal runs twice: before the
download it frees what is not needed even if this run fails (the disk preflight counts those
bytes); after the release switch it removes what was ``previous`` until the switch (the new
``previous`` is the release that served until now).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .layout import Layout
from .weights import human_bytes


@dataclass(frozen=True)
class SnapshotPlan:
    remove: tuple[dict, ...] = ()  # snapshots of HostState
    releases: tuple[str, ...] = ()  # release folders that need a removed snapshot
    keep: dict = field(default_factory=dict)  # snapshot path -> why it stays

    @property
    def freed_bytes(self) -> int:
        return sum(s["bytes"] for s in self.remove)

    def summary(self) -> str:
        if not self.remove:
            return f"{len(self.keep)} snapshots kept, none to remove"
        gone = ", ".join(f"{s['repo']}@{s['commit'][:12]}" for s in self.remove)
        return f"remove {gone} ({human_bytes(self.freed_bytes)}); {len(self.keep)} kept"


def _snapshot_of(deployment: dict, release_id: str | None) -> str | None:
    return next((r["snapshot"] for r in deployment["releases"] if r["id"] == release_id), None)


def plan_snapshots(state: dict, name: str, new_snapshot: str, keep: int,
                   new_release: str | None = None, after_switch: bool = False) -> SnapshotPlan:
    """What to remove on a host (its ``fleet.HostState``) for deployment ``name`` deploying ``new_snapshot``.

    + keep: snapshots of this deployment's kept releases that stay, newest first (current's and
      previous's always stay, on top)
    + new_release: the release this run makes current (None: not known yet)
    + after_switch: plan for the state after the switch (``previous`` is then today's ``current``)
    """
    mine = state["deployments"].get(name, {"releases": [], "current": None, "previous": None, "staging": {}})
    keep_why: dict[str, str] = {new_snapshot: "this run deploys it"}
    current, previous = mine.get("current"), mine.get("previous")
    switching = new_release is not None and new_release != current
    guarded = {current: "current"}
    if not (after_switch and switching):
        guarded[previous] = "previous"
    elif current:
        guarded[current] = "previous after this run's switch"
    for release_id, role in guarded.items():
        path = _snapshot_of(mine, release_id)
        if path:
            keep_why.setdefault(path, f"{name}'s {role} release uses it")
    if not after_switch and (mine.get("staging") or {}).get("snapshot"):
        keep_why.setdefault(mine["staging"]["snapshot"], f"{name}'s overlay links to it")
    # every other deployment keeps whatever its kept releases and staging overlay use
    for other, deployment in state["deployments"].items():
        if other == name:
            continue
        used = [r["snapshot"] for r in deployment["releases"]] + [(deployment.get("staging") or {}).get("snapshot")]
        for path in filter(None, used):
            keep_why.setdefault(path, f"deployment {other} uses it")
    # then this deployment's kept releases, newest first, up to the keep count of snapshots
    ours = [path for path in keep_why if path == new_snapshot or path in {_snapshot_of(mine, r) for r in guarded}]
    for release in mine["releases"]:  # newest first (HostState sorts them)
        path = release["snapshot"]
        if path and path not in ours and len(set(ours)) < keep:
            ours.append(path)
            keep_why.setdefault(path, f"within keep_snapshots={keep} ({name} release {release['id']})")
    remove = tuple(s for s in state["snapshots"] if s["complete"] and s["path"] not in keep_why)
    for s in state["snapshots"]:
        if not s["complete"]:
            keep_why.setdefault(s["path"], "no manifest: a download to resume")
    gone = {s["path"] for s in remove}
    protected_releases = {current, new_release} | ({previous} if not (after_switch and switching) else set())
    releases = tuple(
        Layout.of_host(state["root"]).of(name).release(r["id"])
        for r in mine["releases"] if r["snapshot"] in gone and r["id"] not in protected_releases
    )
    return SnapshotPlan(remove, releases, {p: keep_why[p] for p in sorted(keep_why)})


def after_switch_only(before: SnapshotPlan, after: SnapshotPlan) -> SnapshotPlan:
    """What the after-switch removal adds to the one before the download (both planned from one state)."""
    done = {s["path"] for s in before.remove}
    return SnapshotPlan(
        tuple(s for s in after.remove if s["path"] not in done),
        tuple(r for r in after.releases if r not in before.releases),
        after.keep,
    )
