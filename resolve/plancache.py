"""Plan-time answers that cannot change, kept on the control machine so a re-run asks nobody.

What is kept, each under a key made of every input that chose it:
- a Hub commit's file listing and its small config files (``hub-tree``, ``hub-file``): the Hub
  addresses a commit by the hash of its content, so the answer for (endpoint, repo, full commit)
  is the same forever; a moved branch is a new commit (the lock file pins it), hence a new key;
- an exact vLLM build on an index (``vllm-build``): the version, the index and its wheels for
  (package, version or commit, variant, index URLs).
Nothing is kept for a branch, a tag or ``nightly: latest`` (the lock file pins those first), nor for
an error: a failed answer is asked again next run. ``refresh_lock: true`` asks everything again and
rewrites what is kept. Files live under ``$HEAVYLIFT_CACHE/plan`` (default ``~/.cache/heavylift``);
deleting them only costs the next run its requests.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

FULL_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def hub_endpoint(endpoint: str | None) -> str:
    """The Hub a call reaches: the site's endpoint, else HF_ENDPOINT (huggingface_hub reads it), else the public Hub."""
    return endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co"


def cache_dir() -> Path:
    return Path(os.environ.get("HEAVYLIFT_CACHE", Path.home() / ".cache" / "heavylift")) / "plan"


def entry_path(kind: str, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps([kind, key], sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir() / f"{kind}-{digest}.json"


def kept(kind: str, key: dict, compute, refresh: bool = False, encode=lambda v: v, decode=lambda v: v):
    """``compute()``'s answer for ``key``: the kept one unless ``refresh``; a fresh answer is kept."""
    path = entry_path(kind, key)
    if not refresh:
        try:
            document = json.loads(path.read_text())
            if document.get("key") == key:  # the whole key, not only its hash
                return decode(document["value"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    value = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        # the value as it came, key order included: a config rendered from it must be the same bytes
        partial.write_text(json.dumps({"key": key, "value": encode(value)}) + "\n")
        partial.replace(path)
    except OSError:  # a read-only home: the next run asks again
        pass
    return value
