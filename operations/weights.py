"""Weights: a pinned Hub snapshot downloaded on the host and recorded in a manifest.

Rules encoded here (huggingface_hub 2.4.0):
- ``snapshot_download(local_dir=...)`` keeps per-file metadata under
  ``<local_dir>/.cache/huggingface/``; with a full 40-hex revision it skips files it has
  (huggingface_hub/_snapshot_download.py, _local_folder.py).
- Fresh downloads are only size-checked by the client, so heavylift hashes every file
  before it writes the manifest (huggingface_hub/file_download.py ``http_get`` compares the
  size only; docs/field-notes.md, "Hugging Face Hub").
- A file being downloaded into ``local_dir`` is written to a partial file
  ``<local_dir>/.cache/huggingface/download/<dir>/<hash>.<etag>.incomplete``
  (huggingface_hub/_local_folder.py ``incomplete_path``) and renamed into place when complete;
  huggingface_hub 2.4.0 itself adds a process-unique part before ``.incomplete`` and never resumes
  (file_download.py ``_download_to_tmp_and_move``, PR #4228), so fetch_weights.py downloads into
  ``incomplete_path(etag)`` itself and resumes it with a Range request after a killed run. The
  progress lines count partial bytes too.

Before a byte moves, the bytes still needed are checked against the free space of the content folder's
file system (``FreeSpace``) and a margin: a download that cannot fit fails before it starts. This module
reads the facts; the plan (what to fetch, resume and verify, and whether it fits) is resolve/weights.py's.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from io import StringIO

from pyinfra import host, logger, state
from pyinfra.api import FactBase, FunctionCommand, OperationError, QuoteString, StringCommand, operation
from pyinfra.operations import files

from resolve.hub import HubFile, Snapshot, matches  # noqa: F401 (what the operations take)
from resolve.weights import WeightsPlan, plan_weights

from . import hostpython

# the scripts heavylift uploads and runs on the host, from this folder of the repo
SCRIPTS_DIR = posixpath.join(posixpath.dirname(__file__), "scripts")
HOST_SCRIPTS = ("fetch_weights.py", "verify_weights.py")


CHECK_MANIFEST = hostpython.script("manifest_check.py")


class WeightsManifest(FactBase):
    """A content folder checked against its manifest by size and mtime: reads no shard bytes.

    ``present`` maps every file in the folder (outside ``.cache``) to its size on disk;
    ``partial`` every partial file under ``.cache/huggingface/download`` (its path there) to its size.
    """

    def command(self, manifest, folder):
        return StringCommand(hostpython.PYTHON, "-c", QuoteString(CHECK_MANIFEST), QuoteString(manifest), QuoteString(folder))

    def process(self, output):
        return json.loads("\n".join(output))


# the nearest existing folder of the path (the content folder does not exist before the first
# download), then df's POSIX line for it: "<fs> <1024-blocks> <used> <available> <capacity>% <mount>"
FREE_SPACE = 'p={path}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; printf "%s\\n" "$p"; df -Pk "$p" | tail -n 1'
DF_LINE = re.compile(r"\s(\d+)\s+(\d+)\s+(\d+)\s+(\d+|-)%\s+/")


class FreeSpace(FactBase):
    """Free space of the file system that will hold ``path``, read with ``df -Pk`` on its
    nearest existing parent: ``{"path": that parent, "free_bytes", "total_bytes"}``."""

    def command(self, path):
        return FREE_SPACE.replace("{path}", shlex.quote(path))

    def process(self, output):
        lines = [line for line in output if line.strip()]
        match = DF_LINE.search(" " + lines[-1]) if len(lines) >= 2 else None
        if match is None:
            return None
        return {"path": lines[0], "free_bytes": int(match.group(3)) * 1024, "total_bytes": int(match.group(1)) * 1024}


def planned(snapshot: Snapshot, local_dir: str, manifest: str, verify: str = "fast",
            disk_margin_gb: float = 20, freed_bytes: int = 0) -> tuple[WeightsPlan, dict]:
    """The host's weights plan (resolve/weights.py) from its WeightsManifest and FreeSpace, and the manifest fact."""
    found = host.get_fact(WeightsManifest, manifest=manifest, folder=local_dir) or {"state": "absent"}
    free = host.get_fact(FreeSpace, path=local_dir)
    return plan_weights(snapshot, found, free, verify, disk_margin_gb, freed_bytes), found


def preflight(snapshot: Snapshot, local_dir: str, manifest: str, verify: str = "fast",
              disk_margin_gb: float = 20, freed_bytes: int = 0) -> WeightsPlan:
    """The disk check of ``downloaded`` for deploy code: call it before the operations run so a
    download that cannot fit stops the run at prepare time, also under ``pyinfra -y`` (which does
    not run operation generators until execution). ``freed_bytes``: what a removal before the
    download frees (old snapshots), counted as free space."""
    plan, _ = planned(snapshot, local_dir, manifest, verify, disk_margin_gb, freed_bytes)
    try:
        plan.check_fits()
    except OperationError as error:
        # raised while pyinfra loads the deploy on every host, it ends the whole run before any host changes
        # and pyinfra prints it without the host: a fleet's operator must see which host has too little disk
        raise OperationError(f"{host.name}: {error}") from None
    return plan


@operation()
def refused(why: str):
    """
    A host the run leaves untouched because its disk cannot hold the checkpoint (``when_disk_too_small:
    proceed``): this operation fails it when the run executes, saying why, so the run ends failed and names it.

    + why: the disk check's refusal (host, checkpoint, needed and free figures)
    """
    if not state.is_executing:
        host.noop(f"refused: {why}")
        return
    yield FunctionCommand(_refuse, (why,), {})


def _refuse(state, host, why):
    host.log_styled(f"refused, left untouched: {why}", fg="red", log_func=logger.error)
    return False


@operation()
def downloaded(snapshot: Snapshot, local_dir: str, manifest: str, python: str, script_dir: str,
               endpoint: str | None = None, workers: int = 8, verify: str = "fast", disk_margin_gb: float = 20,
               stall_seconds: int = 300, tries: int = 5, token_file: str | None = None, freed_bytes: int = 0,
               source: dict | None = None):
    """
    A pinned Hub snapshot present and verified in ``local_dir``.

    + snapshot: the commit and files to have (from ``list_snapshot``)
    + local_dir: the content folder; heavylift never edits it after the download
    + manifest: where the verified sizes and sha256 sums are recorded
    + python: an interpreter on the host with huggingface_hub
    + script_dir: where heavylift's host scripts live (fetch_weights.py, verify_weights.py)
    + endpoint: a Hub mirror (HF_ENDPOINT); the public Hub when None
    + workers: parallel downloads
    + verify: "fast" trusts the manifest's size and mtime; "full" re-hashes every file on the
      host (all cores) and fetches again only the files that fail
    + disk_margin_gb: free space to keep on the target beyond the download; fails before any
      byte moves when the files still to fetch do not fit
    + stall_seconds: a download that gets no byte for this long is killed and started again
    + tries: download attempts (stalls and failures) before the operation fails
    + token_file: a file on the host holding the HF token (gated repos); read by the host script,
      never passed in argv or the request file
    + freed_bytes: what an earlier operation of the run frees before this one (old snapshots); counted
      while planning only: when this runs, the free space read then already includes it
    + source: fetch from the site source instead of the Hub (operations/sitesource.py: ``{"url", "name",
      "header_file", "wait_seconds"}``), with site_fetch.py; verified and recorded the same way
    """
    if verify not in ("fast", "full"):
        raise OperationError(f"verify must be 'fast' or 'full', not {verify!r}")
    plan, found = planned(snapshot, local_dir, manifest, verify, disk_margin_gb,
                          0 if state.is_executing else freed_bytes)
    if plan.up_to_date and verify == "fast":
        host.noop(
            f"{len(found['files'])} files, {found['bytes'] / 1e9:.3f} GB of {plan.label} verified; {plan.summary()}"
        )
        return
    plan.check_fits()
    if not state.is_executing:
        logger.info(f"{host.print_prefix}weights {plan.label}: {plan.summary()}")
    spec = {
        "repo": snapshot.repo,
        "commit": snapshot.commit,
        "local_dir": local_dir,
        "manifest": manifest,
        "workers": workers,
        "endpoint": endpoint,
        "verify": verify,
        "stall_seconds": stall_seconds,
        "tries": tries,
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in snapshot.files],
    }
    if token_file:
        spec["token_file"] = token_file
    if source:
        spec["source"] = source
    spec_path = manifest.removesuffix(".json") + ".request.json"
    yield from files.put._inner(src=StringIO(json.dumps(spec, indent=1)), dest=spec_path)
    # the script removes a stale manifest before it changes the folder, and writes the new one
    # only after every file verifies
    yield StringCommand(
        "env", "HF_HUB_DISABLE_PROGRESS_BARS=1", QuoteString(python),
        QuoteString(posixpath.join(script_dir, "site_fetch.py" if source else "fetch_weights.py")), QuoteString(spec_path),
    )
