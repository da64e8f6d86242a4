"""The weights plan of one host: what the download will fetch, resume and verify, and whether it fits the disk, decided
from the snapshot's file list and what the host's facts say (operations/weights.py reads them: ``WeightsManifest``,
``FreeSpace``).

Before a byte moves, the bytes still needed (the listing's sizes minus files already present
with their listed size, minus the partial files the fetch will resume) are checked against the free
space of the content folder's file system plus the partial files the fetch will remove, and a margin:
a download that cannot fit fails before it starts. Partial files are sorted by huggingface_hub 2.4.0's
rules (operations/weights.py, operations/scripts/fetch_weights.py).
"""

from __future__ import annotations

import base64
import hashlib
import posixpath
from dataclasses import dataclass

from pyinfra.api.exceptions import OperationError

from .hub import Snapshot


def partial_prefix(path: str) -> str:
    """Where a repo file's partial files start, under ``.cache/huggingface/download``: its folder and
    huggingface_hub 2.4.0's ``_short_hash`` of ``<name>.metadata`` (``_local_folder.py``, urlsafe base64
    of the sha1), as ``fetch_weights.sort_partials`` reads them on the host."""
    folder, name = posixpath.split(path)
    digest = base64.urlsafe_b64encode(hashlib.sha1(f"{name}.metadata".encode()).digest()).decode()
    return posixpath.join(folder, digest)


def sort_partials(snapshot: Snapshot, to_fetch: tuple[str, ...], partial: dict[str, int]) -> tuple[int, int]:
    """(bytes the fetch will resume, bytes of partial files it will remove): the rule of
    ``fetch_weights.sort_partials``. A partial file is resumed when it is ``<prefix>.<etag>.incomplete``
    of a file still to fetch that has the Hub's sha256, and no bigger than it (one per file: the commit
    fixes the etag); every other one (a dead run's process-unique file, one of a file no longer needed) is removed."""
    owners = {partial_prefix(f.path): f for f in snapshot.files if f.path in to_fetch and f.sha256}
    resume: dict[str, int] = {}
    stale = 0
    for path, size in partial.items():
        parent, name = posixpath.split(path)
        parts = name.split(".")
        owner = owners.get(posixpath.join(parent, parts[0]))
        if owner and len(parts) == 3 and size <= owner.size:
            resume[owner.path] = max(size, resume.get(owner.path, 0))
        else:
            stale += size
    return sum(resume.values()), stale


def human_bytes(count: float) -> str:
    """540.1 GB, 612.3 kB, 0 B: decimal units, as the Hub and df -H show them."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(count) >= size:
            return f"{count / size:.1f} {unit}"
    return f"{int(count)} B"


@dataclass(frozen=True)
class WeightsPlan:
    """What the weights operation will do on one host, decided from its facts before any byte moves."""

    label: str  # repo@commit[:12]
    to_fetch: tuple[str, ...]
    fetch_bytes: int
    to_verify: tuple[str, ...]  # present files hashed again (not vouched for by the manifest, or verify: full)
    up_to_date: bool  # the manifest vouches for exactly these files: nothing to fetch or hash (in fast mode)
    free: dict | None  # FreeSpace of the content folder
    margin_bytes: int
    resume_bytes: int = 0  # bytes of partial files a killed run left that the fetch resumes (not in fetch_bytes)
    stale_bytes: int = 0  # bytes of partial files no run can resume: removed before the fetch
    freed_bytes: int = 0  # what the snapshot removal before the download frees (resolve/diskgc.py)

    @property
    def free_bytes(self) -> int | None:
        """Free space once the fetch has removed the stale partial files and the old snapshots are gone."""
        return None if self.free is None else self.free["free_bytes"] + self.stale_bytes + self.freed_bytes

    @property
    def headroom_after(self) -> int | None:
        return None if self.free is None else self.free_bytes - self.fetch_bytes

    def summary(self) -> str:
        fetch = f"{len(self.to_fetch)} files, {human_bytes(self.fetch_bytes)} to fetch"
        if self.resume_bytes:
            fetch += f" ({human_bytes(self.resume_bytes)} more resumed from partial files)"
        if self.stale_bytes:
            fetch += f", {human_bytes(self.stale_bytes)} of a dead run's partial files to remove"
        verify = f"{len(self.to_verify)} files to re-verify"
        if self.free is None:
            room = "free space unknown (df failed)"
        else:
            room = f"{human_bytes(self.headroom_after)} free after on {self.free['path']}"
            if self.freed_bytes:
                room += f" (counting {human_bytes(self.freed_bytes)} of old snapshots removed first)"
        return f"{fetch}, {verify}, {room}"

    def check_fits(self) -> None:
        """OperationError when the files still to fetch do not fit with the margin."""
        if not self.fetch_bytes or self.free is None:
            return
        if self.fetch_bytes + self.margin_bytes > self.free_bytes:
            freed = f", {human_bytes(self.stale_bytes)} more once a dead run's partial files are removed" if self.stale_bytes else ""
            if self.freed_bytes:
                freed += f" + {human_bytes(self.freed_bytes)} from old snapshots removed first"
            raise OperationError(
                f"{self.label}: {human_bytes(self.fetch_bytes)} still to download but {self.free['path']} has "
                f"{human_bytes(self.free['free_bytes'])} free{freed} (margin {self.margin_bytes / 1e9:g} GB). "
                "Fix: free space or set root to a bigger disk (or lower disk_margin_gb)."
            )


def plan_weights(snapshot: Snapshot, found: dict, free: dict | None, verify: str = "fast",
                 disk_margin_gb: float = 20, freed_bytes: int = 0) -> WeightsPlan:
    """The host's weights plan from ``found`` (its ``WeightsManifest``) and ``free`` (its ``FreeSpace``)."""
    wanted = sorted(f.path for f in snapshot.files)
    present = found.get("present", {})
    up_to_date = found["state"] == "complete" and found["files"] == wanted
    vouched = set(found.get("files", [])) - set(found.get("changed", [])) if found["state"] != "absent" else set()
    to_fetch = tuple(f.path for f in snapshot.files if present.get(f.path) != f.size)
    if verify == "full":
        to_verify = tuple(f.path for f in snapshot.files if f.path not in to_fetch)
    else:
        to_verify = tuple(f.path for f in snapshot.files if f.path not in to_fetch and f.path not in vouched)
    resume_bytes, stale_bytes = sort_partials(snapshot, to_fetch, found.get("partial", {}))
    return WeightsPlan(
        label=f"{snapshot.repo}@{snapshot.commit[:12]}",
        to_fetch=to_fetch,
        fetch_bytes=sum(f.size for f in snapshot.files if f.path in to_fetch) - resume_bytes,
        to_verify=to_verify,
        up_to_date=up_to_date,
        free=free,
        margin_bytes=int(disk_margin_gb * 1e9),
        resume_bytes=resume_bytes,
        stale_bytes=stale_bytes,
        freed_bytes=freed_bytes,
    )
