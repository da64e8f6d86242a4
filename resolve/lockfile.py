"""The lock file: moving references resolved once, so every host and the next run get the same bytes.

It sits beside the inventory (``inventory/site.py`` -> ``inventory/site.lock.json``).
A Hub branch such as ``main`` is resolved to its commit the first time and read from
the lock afterwards; so is ``vllm: {"nightly": "latest"}`` (key ``vllm nightly <wheel index>
<variant>``: exact version and full commit, resolve/vllm_build.py). ``refresh_lock: true`` in
host data (or ``--data refresh_lock=true``) resolves again. Dry runs resolve but never write.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from models.errors import HeavyliftConfigError

PUBLIC_HUB = "https://huggingface.co"


class LockFileError(HeavyliftConfigError):
    """The lock file cannot be read: said with its path and the fix, before any host changes."""


def _entries(path: Path, text: str) -> dict[str, dict]:
    fix = f"Fix: restore {path.name} from version control, or delete it to resolve every reference again. No host was changed."
    try:
        document = json.loads(text)
    except ValueError as error:
        raise LockFileError(f"{path}: the lock file is not valid JSON ({error}). {fix}") from None
    if not isinstance(document, dict) or not isinstance(document.get("resolved", {}), dict):
        raise LockFileError(f"{path}: field 'resolved': the lock file is not a mapping with a 'resolved' mapping. {fix}")
    entries = document.get("resolved", {})
    for key, value in entries.items():
        # every entry is {"commit": ..., ...} (Hub) or {"version": ..., "commit": ...} (nightly build)
        if not isinstance(value, dict) or not all(isinstance(v, (str, int, float, type(None))) for v in value.values()):
            raise LockFileError(f"{path}: field 'resolved.{key}': not a mapping of exact values. {fix}")
    return entries


class LockFile:
    """The lock file of one run (``RunContext.lock_file``); a dry run (``dry``) resolves but never writes."""

    def __init__(self, path: Path, dry: bool = False):
        self.path = path
        self.dry = dry
        self.entries: dict[str, dict] = {}
        if path.exists():
            self.entries = _entries(path, path.read_text())

    def get(self, key: str) -> dict | None:
        return self.entries.get(key)

    def record(self, key: str, value: dict) -> None:
        self.entries[key] = value
        if self.dry:
            return
        document = {
            "comment": "written by heavylift: moving references resolved to exact ones; commit this file",
            "resolved": dict(sorted(self.entries.items())),
        }
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(document, indent=2) + "\n")
        partial.replace(self.path)


def hub_commit(lock: LockFile, hub, repo: str, revision: str, refresh: bool) -> str:
    """The commit a Hub revision stands for: itself when pinned, else from the lock or the Hub
    (``hub``: resolve.hub.Hub, the site's endpoint and token)."""
    if len(revision) == 40 and all(c in "0123456789abcdef" for c in revision):
        return revision
    endpoint = hub.endpoint
    key = f"hub {endpoint or PUBLIC_HUB} {repo}@{revision}"
    entry = lock.get(key)
    if entry and not refresh:
        commit = entry.get("commit")
        if not (isinstance(commit, str) and len(commit) == 40):
            raise LockFileError(
                f"{lock.path}: field 'resolved.{key}.commit': {commit!r} is not a full 40-hex commit. Fix: restore "
                f"{lock.path.name} from version control, or delete it to resolve every reference again. No host was changed."
            )
        return commit
    commit = hub.commit(repo, revision)
    if entry is None or entry["commit"] != commit:
        lock.record(key, {"commit": commit, "resolved_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    return commit
