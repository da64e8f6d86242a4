"""Weights: a pinned Hub snapshot downloaded on the host and recorded in a manifest.

Rules encoded here (huggingface_hub 2.4.0):
- ``snapshot_download(local_dir=...)`` keeps per-file metadata under
  ``<local_dir>/.cache/huggingface/``; with a full 40-hex revision it skips files it has
  (huggingface_hub/_snapshot_download.py, _local_folder.py).
- Fresh downloads are only size-checked by the client, so heavylift hashes every file
  before it writes the manifest (FACTS: "Fresh downloads are only size-checked").
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
from dataclasses import dataclass
from functools import lru_cache
from io import StringIO

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.operations import files

SCRIPTS_DIR = posixpath.join(posixpath.dirname(__file__), "scripts")


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    sha256: str | None  # the Hub's LFS sha256 where it gives one


@dataclass(frozen=True)
class Snapshot:
    repo: str
    commit: str
    files: tuple[HubFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def matches(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, pattern) for pattern in patterns)


@lru_cache(maxsize=None)
def list_snapshot(repo: str, commit: str, endpoint: str | None, patterns: tuple[str, ...]) -> Snapshot:
    """The files of a pinned commit that the deployment needs, with sizes and LFS hashes."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint)
    found = []
    for item in api.list_repo_tree(repo, revision=commit, recursive=True):
        if isinstance(item, RepoFile) and matches(item.path, list(patterns)):
            sha = item.lfs.sha256 if item.lfs else None
            found.append(HubFile(item.path, item.size, sha))
    if not found:
        raise ValueError(f"{repo}@{commit} has no files matching {list(patterns)}")
    return Snapshot(repo, commit, tuple(sorted(found, key=lambda f: f.path)))


CHECK_MANIFEST = r"""
import json, os, sys
manifest, folder = sys.argv[1], sys.argv[2]
try:
    entries = json.load(open(manifest))["files"]
except (OSError, ValueError, KeyError):
    print(json.dumps({"state": "absent"})); sys.exit(0)
changed = []
for name, want in entries.items():
    try:
        st = os.stat(os.path.join(folder, name))
    except OSError:
        changed.append(name); continue
    if st.st_size != want["size"] or st.st_mtime_ns != want["mtime_ns"]:
        changed.append(name)
print(json.dumps({"state": "changed" if changed else "complete", "changed": changed,
                  "files": sorted(entries), "bytes": sum(e["size"] for e in entries.values())}))
"""


class WeightsManifest(FactBase):
    """A content folder checked against its manifest by size and mtime: reads no shard bytes."""

    def command(self, manifest, folder):
        return StringCommand("python3", "-c", QuoteString(CHECK_MANIFEST), QuoteString(manifest), QuoteString(folder))

    def process(self, output):
        return json.loads("\n".join(output))


@operation()
def downloaded(snapshot: Snapshot, local_dir: str, manifest: str, python: str, script_dir: str,
               endpoint: str | None = None, workers: int = 8):
    """
    A pinned Hub snapshot present and verified in ``local_dir``.

    + snapshot: the commit and files to have (from ``list_snapshot``)
    + local_dir: the content folder; heavylift never edits it after the download
    + manifest: where the verified sizes and sha256 sums are recorded
    + python: an interpreter on the host with huggingface_hub
    + script_dir: where heavylift's host scripts live
    + endpoint: a Hub mirror (HF_ENDPOINT); the public Hub when None
    + workers: parallel downloads
    """
    state = host.get_fact(WeightsManifest, manifest=manifest, folder=local_dir)
    wanted = sorted(f.path for f in snapshot.files)
    if state["state"] == "complete" and state["files"] == wanted:
        host.noop(f"{len(wanted)} files, {state['bytes'] / 1e9:.3f} GB of {snapshot.repo}@{snapshot.commit[:12]} verified")
        return
    spec = {
        "repo": snapshot.repo,
        "commit": snapshot.commit,
        "local_dir": local_dir,
        "manifest": manifest,
        "workers": workers,
        "endpoint": endpoint,
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in snapshot.files],
    }
    spec_path = manifest.removesuffix(".json") + ".request.json"
    yield from files.put._inner(src=StringIO(json.dumps(spec, indent=1)), dest=spec_path)
    # a stale manifest must not vouch for a folder that is being rewritten
    yield StringCommand("rm", "-f", QuoteString(manifest))
    yield StringCommand(
        "env", "HF_HUB_DISABLE_PROGRESS_BARS=1", QuoteString(python),
        QuoteString(posixpath.join(script_dir, "fetch_weights.py")), QuoteString(spec_path),
    )
