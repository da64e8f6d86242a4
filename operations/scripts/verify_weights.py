"""Re-hash a content folder against its manifest, in parallel across the host's cores.

Runs on the host (standard library only). Usage:

    verify_weights.py MANIFEST FOLDER [--workers N] [--delete-bad]

Prints one line per file that is missing, has another size or another sha256, and a summary;
exits 1 when any file fails. fetch_weights.py imports ``hash_files`` for ``verify: full``.
"""

import argparse
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

BLOCK = 8 * 1024 * 1024  # 8 MiB reads


def sha256_of(path, block=BLOCK):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def hash_files(paths, workers=None):
    """{path: sha256} for every path, one file per process (the biggest first, to balance the pool)."""
    paths = sorted(paths, key=lambda p: os.path.getsize(p), reverse=True)
    if not paths:
        return {}
    workers = max(1, min(workers or os.cpu_count() or 1, len(paths)))
    if workers == 1:
        return {path: sha256_of(path) for path in paths}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return dict(zip(paths, pool.map(sha256_of, paths)))


def check(entries, folder, workers=None):
    """(good, bad) for manifest entries {name: {"size", "sha256", ...}}: good maps name -> sha256,
    bad maps name -> why it fails."""
    bad, sized = {}, {}
    for name, want in entries.items():
        path = os.path.join(folder, name)
        try:
            size = os.stat(path).st_size
        except OSError:
            bad[name] = "missing"
            continue
        if size != want["size"]:
            bad[name] = f"{size} bytes, the manifest says {want['size']}"
        else:
            sized[path] = name
    good = {}
    for path, digest in hash_files(list(sized), workers).items():
        name = sized[path]
        if digest == entries[name]["sha256"]:
            good[name] = digest
        else:
            bad[name] = f"sha256 {digest}, the manifest says {entries[name]['sha256']}"
    return good, bad


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest")
    parser.add_argument("folder")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: every core)")
    parser.add_argument("--delete-bad", action="store_true", help="delete the files that fail")
    args = parser.parse_args(argv)
    with open(args.manifest) as handle:
        entries = json.load(handle)["files"]
    started = time.monotonic()
    good, bad = check(entries, args.folder, args.workers)
    for name, why in sorted(bad.items()):
        print(f"FAILED {name}: {why}", flush=True)
        if args.delete_bad and why != "missing":
            os.remove(os.path.join(args.folder, name))
    total = sum(entries[name]["size"] for name in good)
    seconds = time.monotonic() - started
    print(f"verified {len(good)} of {len(entries)} files, {total / 1e9:.3f} GB in {seconds:.1f} s", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
