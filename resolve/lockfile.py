"""The lock file: moving references resolved once, so every host and the next run get the same bytes.

It sits beside the inventory (``inventory/site.py`` -> ``inventory/site.lock.json``).
A Hub branch such as ``main`` is resolved to its commit the first time and read from
the lock afterwards; so is ``vllm: {"nightly": "latest"}`` (key ``vllm nightly <wheel index>
<variant>``: exact version and full commit, resolve/vllm_build.py). ``refresh_lock: true`` in
host data (or ``--data refresh_lock=true``) resolves again. Dry runs resolve but never write.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from models.errors import HeavyliftConfigError

PUBLIC_HUB = "https://huggingface.co"


def is_dry_run() -> bool:
    # pyinfra keeps --dry in its CLI and does not tell the deploy code
    return "--dry" in sys.argv


def inventory_path() -> Path | None:
    """The inventory file named on the pyinfra command line."""
    deploy_names = {"deploy.py"}
    for arg in sys.argv[1:]:
        if arg.endswith(".py") and Path(arg).name not in deploy_names and Path(arg).is_file():
            return Path(arg).resolve()
    return None


def lock_path() -> Path:
    override = os.environ.get("HEAVYLIFT_LOCK_FILE")
    if override:
        return Path(override)
    inventory = inventory_path()
    if inventory is None:
        return Path.cwd() / "heavylift.lock.json"
    return inventory.with_suffix(".lock.json")


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
    def __init__(self, path: Path):
        self.path = path
        self.entries: dict[str, dict] = {}
        if path.exists():
            self.entries = _entries(path, path.read_text())

    def get(self, key: str) -> dict | None:
        return self.entries.get(key)

    def record(self, key: str, value: dict) -> None:
        self.entries[key] = value
        if is_dry_run():
            return
        document = {
            "comment": "written by heavylift: moving references resolved to exact ones; commit this file",
            "resolved": dict(sorted(self.entries.items())),
        }
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(document, indent=2) + "\n")
        partial.replace(self.path)


_locks: dict[Path, LockFile] = {}


def current_lock() -> LockFile:
    path = lock_path()
    if path not in _locks:
        _locks[path] = LockFile(path)
    return _locks[path]


def hub_commit(repo: str, revision: str, endpoint: str | None, refresh: bool) -> str:
    """The commit a Hub revision stands for: itself when pinned, else from the lock or the Hub."""
    if len(revision) == 40 and all(c in "0123456789abcdef" for c in revision):
        return revision
    lock = current_lock()
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
    from huggingface_hub import HfApi

    commit = HfApi(endpoint=endpoint).model_info(repo, revision=revision).sha
    if entry is None or entry["commit"] != commit:
        lock.record(key, {"commit": commit, "resolved_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    return commit
