"""Download a pinned Hub snapshot into a content folder, verify it, then write its manifest.

Runs on the host with huggingface_hub. Usage: fetch_weights.py SPEC.json
The manifest is written only after every file is verified, via a temporary file and a
rename: its presence means "this folder holds exactly these bytes".
"""

import hashlib
import json
import os
import sys
import time

from huggingface_hub import snapshot_download


def sha256_of(path, chunk=8 * 1024 * 1024):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def main(spec_path):
    with open(spec_path) as handle:
        spec = json.load(handle)
    started = time.monotonic()
    print(f"fetching {spec['repo']}@{spec['commit']} ({len(spec['files'])} files) into {spec['local_dir']}", flush=True)
    snapshot_download(
        repo_id=spec["repo"],
        revision=spec["commit"],
        local_dir=spec["local_dir"],
        allow_patterns=[f["path"] for f in spec["files"]],
        max_workers=spec["workers"],
        endpoint=spec.get("endpoint"),
    )
    entries = {}
    total = 0
    for expected in spec["files"]:
        path = os.path.join(spec["local_dir"], expected["path"])
        stat = os.stat(path)
        if stat.st_size != expected["size"]:
            sys.exit(f"{expected['path']}: {stat.st_size} bytes on disk, the Hub lists {expected['size']}")
        digest = sha256_of(path)
        if expected.get("sha256") and digest != expected["sha256"]:
            sys.exit(f"{expected['path']}: sha256 {digest} does not match the Hub's {expected['sha256']}")
        entries[expected["path"]] = {"size": stat.st_size, "sha256": digest, "mtime_ns": stat.st_mtime_ns}
        total += stat.st_size
    manifest = {"repo": spec["repo"], "commit": spec["commit"], "files": entries}
    partial = spec["manifest"] + ".partial"
    with open(partial, "w") as handle:
        json.dump(manifest, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, spec["manifest"])
    seconds = time.monotonic() - started
    print(f"verified {len(entries)} files, {total / 1e9:.3f} GB in {seconds:.1f} s ({total / 1e9 / max(seconds, 1e-9):.3f} GB/s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
