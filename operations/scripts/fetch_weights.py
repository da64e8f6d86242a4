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
2. huggingface_hub fetches only the missing files, in a child process watched by this one:
   a progress line (bytes done/total, rate, ETA) every HEAVYLIFT_PROGRESS_SECONDS seconds
   (default 10), whole lines for pyinfra. When no byte arrives for ``stall_seconds`` the child
   is killed and started again (hf-xet 1.5.1 could stall forever on ~500 GB pulls, xet-core
   #883); a child that fails (connection lost beyond huggingface_hub's own retries) is started
   again too, after a back-off. After ``tries`` attempts the run fails, keeping what it fetched.
   The child dies with this process (PR_SET_PDEATHSIG): a killed run leaves no download behind.
3. The fetched files are hashed and checked against the Hub's LFS sha256 where it gives one.

One fetch at a time per content folder: a second one waits on ``<manifest>.lock`` (flock).
Usage of the child: fetch_weights.py --download SPEC.json (the file names to fetch on stdin).
"""

import ctypes
import fcntl
import glob
import json
import os
import signal
import stat
import subprocess
import sys
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


def progress_interval():
    try:
        return max(0.1, float(os.environ.get("HEAVYLIFT_PROGRESS_SECONDS", "10")))
    except ValueError:
        return 10.0


def die_with_parent():
    """In the child, before exec: the kernel kills it when its parent dies (Linux prctl)."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class DownloadFailed(Exception):
    pass


def download_watched(spec_path, spec, need, total, out=None, command=None):
    """Fetch ``need`` (file names) in a child process; restart it when it stalls or fails.

    Returns the number of tries used; raises DownloadFailed after ``spec["tries"]``.
    ``command`` replaces the child's argv (tests)."""
    out = out or (lambda line: print(line, flush=True))
    command = command or [sys.executable, os.path.abspath(__file__), "--download", spec_path]
    folder = spec["local_dir"]
    stall_seconds, tries = float(spec.get("stall_seconds", 300)), int(spec.get("tries", 5))
    interval = progress_interval()
    baseline = local_bytes(folder) if os.path.isdir(folder) else 0
    started = time.monotonic()
    last_error = "no try made"
    for attempt in range(1, tries + 1):
        child = subprocess.Popen(command, stdin=subprocess.PIPE, preexec_fn=die_with_parent)
        child.stdin.write(json.dumps(need).encode())
        child.stdin.close()
        seen, last_change, last_line = -1, time.monotonic(), time.monotonic()
        while True:
            try:
                code = child.wait(timeout=min(1.0, interval, stall_seconds / 4))
                break
            except subprocess.TimeoutExpired:
                code = None
            now = time.monotonic()
            have = local_bytes(folder)
            if have != seen:
                seen, last_change = have, now
            if now - last_line >= interval:
                out(progress_line(have - baseline, total, now - started))
                last_line = now
            if now - last_change >= stall_seconds:
                child.kill()
                child.wait()
                code = "stalled"
                break
        if code == 0:
            return attempt
        if code == "stalled":
            last_error = f"no byte arrived for {stall_seconds:g} s"
        else:
            last_error = f"the download exited with code {code}"
        if attempt < tries:
            pause = min(30, 2 ** (attempt - 1))
            out(f"retrying: {last_error} (try {attempt} of {tries}); starting again in {pause} s, keeping finished files")
            time.sleep(pause)
    raise DownloadFailed(
        f"download of {spec['repo']}@{spec['commit']} failed after {tries} tries: {last_error}. "
        f"The files fetched so far are kept in {folder}; run again to resume, or raise download_stall_seconds / "
        "download_tries in the site's data."
    )


def download_child(spec_path):
    """The child: huggingface_hub fetches the names given on stdin (exit code != 0 on failure)."""
    with open(spec_path) as handle:
        spec = json.load(handle)
    need = json.load(sys.stdin)
    token = None  # huggingface_hub then reads HF_TOKEN or its own token file, as usual
    if spec.get("token_file"):
        with open(spec["token_file"]) as handle:
            token = handle.read().strip() or None
    from huggingface_hub import snapshot_download

    snapshot_download(
        repo_id=spec["repo"],
        revision=spec["commit"],
        local_dir=spec["local_dir"],
        allow_patterns=[glob.escape(name) for name in need],
        max_workers=spec["workers"],
        endpoint=spec.get("endpoint"),
        token=token,
    )


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


def main(spec_path, download=None):
    """``download(spec_path, spec, need, total)`` fetches the names in ``need`` (default
    ``download_watched``; the unit tests put huggingface_hub's stand-in there)."""
    download = download or download_watched
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
        fetch_started = time.monotonic()
        try:
            download(spec_path, spec, need, total)
        except DownloadFailed as failure:
            sys.exit(str(failure))
        seconds = time.monotonic() - fetch_started
        print(
            f"downloaded {len(need)} files, {total / 1e9:.3f} GB in {seconds:.1f} s "
            f"({total / 1e9 / max(seconds, 1e-9):.3f} GB/s)",
            flush=True,
        )

    # 3. hash what was fetched, against the listing's size and the Hub's sha256; a file that fails
    #    (a torn .incomplete resumed, a mirror serving other bytes) is deleted and fetched again
    tries = int(spec.get("tries", 5))
    for attempt in range(1, tries + 1):
        fetched = {}
        for name in need:
            path = os.path.join(folder, name)
            info = os.stat(path)
            if info.st_size != wanted[name]["size"]:
                sys.exit(f"{name}: {info.st_size} bytes on disk, the Hub lists {wanted[name]['size']}")
            fetched[name] = path
        digests = hash_files(list(fetched.values()))
        wrong = {}
        for name, path in fetched.items():
            expected = wanted[name].get("sha256")
            if expected and digests[path] != expected:
                wrong[name] = f"{name}: sha256 {digests[path]} does not match the Hub's {expected}"
                continue
            trusted[name] = {"size": wanted[name]["size"], "sha256": digests[path], "mtime_ns": os.stat(path).st_mtime_ns}
        if not wrong:
            break
        if attempt == tries:
            sys.exit(f"after {tries} tries: " + "; ".join(wrong.values()))
        for name, why in wrong.items():
            print(f"FAILED {why}: fetching it again", flush=True)
            os.remove(os.path.join(folder, name))
        need = sorted(wrong)
        try:
            download(spec_path, spec, need, sum(wanted[name]["size"] for name in need))
        except DownloadFailed as failure:
            sys.exit(str(failure))

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


def locked(manifest_path):
    """Hold ``<manifest>.lock`` for this process's life: one fetch per content folder. A run
    whose SSH connection dropped may still be fetching; the next one waits for it."""
    handle = open(manifest_path + ".lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        print(f"waiting for another fetch of this folder to finish ({handle.read().strip() or 'unknown holder'})", flush=True)
        fcntl.flock(handle, fcntl.LOCK_EX)
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
    handle.flush()
    return handle


if __name__ == "__main__":
    if sys.argv[1] == "--download":
        download_child(sys.argv[2])
    else:
        with open(sys.argv[1]) as spec_file:
            lock = locked(json.load(spec_file)["manifest"])
        main(sys.argv[1])
