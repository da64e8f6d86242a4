"""Disks that don't fill: the snapshots and releases resolve/diskgc.py planned to remove, removed (each manifest
before its files, so a snapshot cut short is never trusted again).
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from resolve.diskgc import SnapshotPlan


@operation()
def snapshots_pruned(plan: SnapshotPlan):
    """
    Snapshots no kept release needs removed, with their manifests and the releases that need them.

    + plan: from resolve/diskgc.py ``plan_snapshots`` (the host's state at prepare time)
    """
    if not plan.remove and not plan.releases:
        host.noop(plan.summary())
        return
    for release_dir in plan.releases:
        yield StringCommand("rm", "-rf", QuoteString(release_dir))
    for snapshot in plan.remove:
        yield from remove_snapshot(snapshot["path"])


def remove_snapshot(path: str):
    """A snapshot's commands: its manifest first (a snapshot without one is never trusted again, even if
    the removal is cut short), then the files beside it (``.manifest.json.lock``, ``.manifest.request.json``),
    then the folder."""
    yield StringCommand("rm", "-f", QuoteString(path + ".manifest.json"))
    yield StringCommand("rm", "-rf", StringCommand(QuoteString(path), ".manifest.*", _separator=""))
    yield StringCommand("rm", "-rf", QuoteString(path))
