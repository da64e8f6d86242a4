"""Download a pinned Hub snapshot into a content folder, verify it, then write its manifest.

Runs on the host with huggingface_hub. Usage: fetch_weights.py SPEC.json
The manifest is written only after every file is verified, via a temporary file and a
rename: its presence means "this folder holds exactly these bytes". It is removed before
the folder is changed.

1. Files the manifest vouches for (same size and mtime) are trusted, unless the spec says
   ``"verify": "full"``: then every present file is hashed again (verify_weights.py, all cores).
   Present files the manifest does not vouch for are hashed too. A file whose sha256 differs
   from the manifest's (or the Hub's LFS sha256), or whose size differs from the listing, is
   deleted so that the download fetches it again.
2. huggingface_hub fetches only the missing files; a progress line (bytes done/total, rate,
   ETA) every HEAVYLIFT_PROGRESS_SECONDS seconds (default 10), whole lines for pyinfra.
3. The fetched files are hashed and checked against the Hub's LFS sha256 where it gives one.
"""

import glob
import json
import os
import stat
import sys
import threading
import time

from verify_weights import hash_files

CACHE = ".cache"  # huggingface_hub's metadata and .incomplete files in a local_dir


def human_bytes(count):
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(count) >= size:
            return f"{count / size:.1f} {unit}"
    return f"{int(count)} B"


def human_seconds(seconds):
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def local_bytes(local_dir):
    """Bytes of the files under local_dir: finished files, plus the ``.incomplete`` files
    huggingface_hub writes under ``<local_dir>/.cache/huggingface/download/`` while it downloads
    (its metadata and lock files there are not counted)."""
    total = 0
    for base, _dirs, names in os.walk(local_dir):
        in_cache = os.path.relpath(base, local_dir).split(os.sep)[0] == CACHE
        for name in names:
            if in_cache and not name.endswith(".incomplete"):
                continue
            try:
                info = os.lstat(os.path.join(base, name))
            except OSError:  # renamed or removed while we walk
                continue
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
    return total


def progress_line(done, total, elapsed):
    """``progress: 12.3 GB of 540.1 GB (2.3%), 1.2 GB/s, ETA 7 min 23 s``"""
    done = max(0, min(done, total))
    rate = done / elapsed if elapsed > 0 else 0.0
    percent = 100.0 * done / total if total else 100.0
    eta = human_seconds((total - done) / rate) if rate > 0 else "unknown"
    return f"progress: {human_bytes(done)} of {human_bytes(total)} ({percent:.1f}%), {human_bytes(rate)}/s, ETA {eta}"


class Progress:
    """Prints a progress line every ``interval`` seconds from the bytes on disk, in a thread."""

    def __init__(self, local_dir, total, interval, out=None):
        self.local_dir, self.total, self.interval = local_dir, total, interval
        self.out = out or (lambda line: print(line, flush=True))
        self.baseline = local_bytes(local_dir) if os.path.isdir(local_dir) else 0
        self.started = time.monotonic()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def done(self):
        now = local_bytes(self.local_dir) if os.path.isdir(self.local_dir) else 0
        return max(0, now - self.baseline)

    def _run(self):
        while not self.stopped.wait(self.interval):
            self.out(progress_line(self.done(), self.total, time.monotonic() - self.started))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc_info):
        self.stopped.set()
        self.thread.join()


def progress_interval():
    try:
        return max(0.1, float(os.environ.get("HEAVYLIFT_PROGRESS_SECONDS", "10")))
    except ValueError:
        return 10.0


def load_manifest(path):
    try:
        with open(path) as handle:
            return json.load(handle)["files"]
    except (OSError, ValueError, KeyError):
        return {}


def stat_or_none(path):
    try:
        return os.stat(path)
    except OSError:
        return None


def remove_manifest(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def main(spec_path):
    with open(spec_path) as handle:
        spec = json.load(handle)
    folder, manifest_path = spec["local_dir"], spec["manifest"]
    wanted = {f["path"]: f for f in spec["files"]}
    full = spec.get("verify", "fast") == "full"
    old = load_manifest(manifest_path)
    started = time.monotonic()
    print(f"fetching {spec['repo']}@{spec['commit']} ({len(wanted)} files) into {folder}", flush=True)

    # 1. what is on disk: trusted (the manifest vouches for it), to hash, or to fetch again
    trusted, to_check, wrong_size = {}, {}, []
    for name, want in wanted.items():
        info = stat_or_none(os.path.join(folder, name))
        if info is None:
            continue
        if info.st_size != want["size"]:
            wrong_size.append(name)
            continue
        entry = old.get(name)
        if not full and entry and entry["size"] == info.st_size and entry["mtime_ns"] == info.st_mtime_ns:
            trusted[name] = entry
        else:
            to_check[name] = (entry or {}).get("sha256") or want.get("sha256")
    bad = []
    if to_check:
        checked_bytes = sum(wanted[name]["size"] for name in to_check)
        what = "re-verifying every file" if full else "verifying files the manifest does not vouch for"
        print(f"{what}: {len(to_check)} files, {human_bytes(checked_bytes)} on {os.cpu_count()} cores", flush=True)
        digests = hash_files([os.path.join(folder, name) for name in to_check])
        for name, expected in to_check.items():
            path = os.path.join(folder, name)
            digest = digests[path]
            if expected and digest != expected:
                print(f"FAILED {name}: sha256 {digest}, expected {expected}: fetching it again", flush=True)
                bad.append(name)
            else:
                trusted[name] = {"size": wanted[name]["size"], "sha256": digest, "mtime_ns": os.stat(path).st_mtime_ns}
    for name in wrong_size:
        print(f"FAILED {name}: not {wanted[name]['size']} bytes: fetching it again", flush=True)

    # 2. fetch what is missing; the manifest goes first, before the folder changes
    need = sorted(name for name in wanted if name not in trusted)
    if need:
        remove_manifest(manifest_path)
        for name in bad + wrong_size:
            os.remove(os.path.join(folder, name))
        total = sum(wanted[name]["size"] for name in need)
        print(f"downloading {len(need)} files, {human_bytes(total)}", flush=True)
        from huggingface_hub import snapshot_download

        fetch_started = time.monotonic()
        with Progress(folder, total, progress_interval()):
            snapshot_download(
                repo_id=spec["repo"],
                revision=spec["commit"],
                local_dir=folder,
                allow_patterns=[glob.escape(name) for name in need],
                max_workers=spec["workers"],
                endpoint=spec.get("endpoint"),
            )
        seconds = time.monotonic() - fetch_started
        print(
            f"downloaded {len(need)} files, {total / 1e9:.3f} GB in {seconds:.1f} s "
            f"({total / 1e9 / max(seconds, 1e-9):.3f} GB/s)",
            flush=True,
        )

    # 3. hash what was fetched, against the listing's size and the Hub's sha256
    fetched = {}
    for name in need:
        path = os.path.join(folder, name)
        info = os.stat(path)
        if info.st_size != wanted[name]["size"]:
            sys.exit(f"{name}: {info.st_size} bytes on disk, the Hub lists {wanted[name]['size']}")
        fetched[name] = path
    digests = hash_files(list(fetched.values()))
    for name, path in fetched.items():
        expected = wanted[name].get("sha256")
        if expected and digests[path] != expected:
            sys.exit(f"{name}: sha256 {digests[path]} does not match the Hub's {expected}")
        trusted[name] = {"size": wanted[name]["size"], "sha256": digests[path], "mtime_ns": os.stat(path).st_mtime_ns}

    entries = {name: trusted[name] for name in sorted(wanted)}
    total = sum(entry["size"] for entry in entries.values())
    seconds = time.monotonic() - started
    if entries == old and os.path.exists(manifest_path):
        print(f"all {len(entries)} files match the manifest, {total / 1e9:.3f} GB checked in {seconds:.1f} s: nothing changed", flush=True)
        return
    manifest = {"repo": spec["repo"], "commit": spec["commit"], "files": entries}
    partial = manifest_path + ".partial"
    with open(partial, "w") as handle:
        json.dump(manifest, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, manifest_path)
    print(f"verified {len(entries)} files, {total / 1e9:.3f} GB in {seconds:.1f} s ({total / 1e9 / max(seconds, 1e-9):.3f} GB/s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
