"""A control-machine wheelhouse (``vllm.wheelhouse_upload``) against the host's copy, without hashing it every run.

A wheel's sha256 is kept in the plan cache (resolve/plancache.py) under its file's identity: real path,
size, mtime_ns, ctime_ns, inode and device. Any write to the file changes its mtime and ctime, and a
restored mtime (``touch -d``, ``cp -p``) is itself a change of ctime that nobody can set back, so a kept
digest is the file's digest (a file changed in the last ``RACY_SECONDS`` is hashed but not kept, see
there); a replaced file is a new inode. A converged re-run stats the wheels and
reads their kept digests: no byte of a 700 MB wheelhouse is read (pyinfra's ``files.sync`` hashed every
wheel here and again on the host, pyinfra 3.10 operations/files.py ``_file_equal``).

The host keeps a record beside its copy (``RECORD``): each wheel's sha256 as uploaded, its size and the
mtime heavylift gave it (the control machine's, in whole seconds). A host wheel is in place when its
size and mtime are the record's and the record's sha256 is the control machine's wheel's.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from . import plancache

RECORD = ".heavylift-wheelhouse.json"


@dataclass(frozen=True)
class LocalWheel:
    name: str
    path: str
    size: int
    mtime: int  # whole seconds: the mtime the host's copy is given (touch -d @MTIME)
    sha256: str


# A file changed less than this long ago is hashed but its digest not kept: the kernel stamps mtime and
# ctime from a clock that moves in ticks (jiffies, a few ms), so a second write within the tick of the first
# leaves both as they were. Kept only once the clock is past that tick, a digest cannot miss a later write
# (git's "racily clean" entries, Documentation/technical/racy-git.txt, are the same problem).
RACY_SECONDS = 2.0


def _hash_file(path: str) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            hasher.update(chunk)
    return hasher.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file, hashed once per identity of the file (module docstring)."""
    real = os.path.realpath(path)
    found = os.stat(real)
    if time.time() - found.st_ctime < RACY_SECONDS:
        return _hash_file(real)
    key = {"path": real, "size": found.st_size, "mtime_ns": found.st_mtime_ns, "ctime_ns": found.st_ctime_ns,
           "inode": found.st_ino, "device": found.st_dev}
    return plancache.kept("file-sha256", key, lambda: _hash_file(real))


def local_wheels(folder: str | os.PathLike) -> list[LocalWheel]:
    """The wheels of a control-machine folder, by name, with their digests (kept ones where the file is the same)."""
    wheels = []
    for path in sorted(Path(folder).glob("*.whl")):
        if not path.is_file():
            continue
        found = path.stat()
        wheels.append(LocalWheel(path.name, str(path), found.st_size, int(found.st_mtime), file_sha256(path)))
    return wheels


def stale(wheels: list[LocalWheel], record: dict, on_host: dict) -> list[LocalWheel]:
    """The wheels the host's copy lacks or holds otherwise: ``record`` is the host's RECORD ({name: {"sha256",
    "size", "mtime"}}), ``on_host`` its wheels' {name: (size, mtime in whole seconds)}."""
    out = []
    for wheel in wheels:
        kept = record.get(wheel.name) or {}
        there = on_host.get(wheel.name)
        if there is None or kept.get("sha256") != wheel.sha256 or list(there) != [kept.get("size"), kept.get("mtime")] \
                or kept.get("size") != wheel.size:
            out.append(wheel)
    return out


def record_of(wheels: list[LocalWheel], record: dict) -> dict:
    """The host's record once ``wheels`` are uploaded (entries of wheels only the host has are kept)."""
    return {**record, **{w.name: {"sha256": w.sha256, "size": w.size, "mtime": w.mtime} for w in wheels}}
