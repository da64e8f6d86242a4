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
2. The missing files are fetched in a child process watched by this one, each through
   huggingface_hub's own HTTP code (``http_get``) into a partial file of a fixed name, so that a
   killed run's partial file is resumed by the next one with a Range request (see
   ``fetch_file``). Partial files no run can resume (a dead run's, under huggingface_hub's own
   process-unique names, or of files no longer wanted) are removed first.
   The child is watched:
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

import base64
import ctypes
import fcntl
import hashlib
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


# Partial files (huggingface_hub 2.4.0, _local_folder.py and file_download.py): a file ``a/b.bin``
# of the repo is downloaded next to its metadata ``<local_dir>/.cache/huggingface/download/a/b.bin.metadata``
# into ``<short>.<etag>.incomplete``, ``<short>`` being ``_short_hash("b.bin.metadata")`` (urlsafe
# base64 of its sha1: no dot in it) (``LocalDownloadFilePaths.incomplete_path``). Since huggingface_hub
# PR #4228, ``_download_to_tmp_and_move`` adds a process-unique part, ``<short>.<etag>.<8 hex>.incomplete``,
# opens it with "wb" and deletes it when the download raises: a new process never resumes it, and a
# SIGKILLed one leaves it behind for good. heavylift writes ``incomplete_path(etag)`` itself (``fetch_file``),
# the name without the random part, and resumes it.


def short_hash(metadata_name):
    """huggingface_hub 2.4.0 ``_local_folder._short_hash``: the partial file's prefix."""
    return base64.urlsafe_b64encode(hashlib.sha1(metadata_name.encode()).digest()).decode()


def partial_files(folder):
    """Every ``.incomplete`` file under ``<folder>/.cache/huggingface/download``: path -> size."""
    found = {}
    for base, _dirs, names in os.walk(os.path.join(folder, CACHE, "huggingface", "download")):
        for name in names:
            if name.endswith(".incomplete"):
                try:
                    found[os.path.join(base, name)] = os.lstat(os.path.join(base, name)).st_size
                except OSError:
                    pass
    return found


def resumable_prefixes(folder, wanted):
    """``<download dir>/<short>`` -> (repo path, size) for the files a partial file may be resumed for:
    those with the Hub's sha256 (a torn partial file then fails its hash; a file without one is
    only size-checked, so it starts from byte 0)."""
    download = os.path.join(folder, CACHE, "huggingface", "download")
    prefixes = {}
    for name, want in wanted.items():
        if want.get("sha256"):
            parent, base = os.path.split(os.path.join(download, *name.split("/")))
            prefixes[os.path.join(parent, short_hash(base + ".metadata"))] = (name, want["size"])
    return prefixes


def sort_partials(folder, wanted, need):
    """Split the partial files into (resumable: repo path -> bytes, stale: path -> bytes).

    Resumable: ``<short>.<etag>.incomplete`` of a file still needed, with a sha256 and no more bytes
    than the file. Stale: every other one (a dead run's process-unique files, a file no longer needed,
    one without a sha256). Called with the content folder's lock held: no other fetch writes there."""
    prefixes = resumable_prefixes(folder, {name: wanted[name] for name in need})
    resumable, stale = {}, {}
    for path, size in partial_files(folder).items():
        parent, base = os.path.split(path)
        parts = base.split(".")
        owner = prefixes.get(os.path.join(parent, parts[0]))
        if owner and len(parts) == 3 and size <= owner[1]:  # one per file: the pinned commit fixes the etag
            resumable[owner[0]] = max(size, resumable.get(owner[0], 0))
            continue
        stale[path] = size
    return resumable, stale


def fetch_file(spec, name, token):
    """One file of the snapshot into the content folder, resuming the partial file a killed run left.

    huggingface_hub 2.4.0's own parts do the work: ``get_hf_file_metadata`` (HEAD: etag, size,
    redirect), ``http_get(resume_size=N)`` (``Range: bytes=N-``; a server that answers 200 instead
    has the file truncated and sent whole; lost connections resumed 5 times), the per-file lock
    ``WeakFileLock(lock_path)`` that its own downloads hold, and ``write_download_metadata``, so the
    folder ends as ``snapshot_download`` leaves it. Xet-backed files go over HTTP too (the Hub's
    resolve URL serves them, as huggingface_hub does when hf_xet is absent): ``xet_get`` writes a fresh
    process-unique file as well (file_download.py ``_download_to_tmp_and_move``), so it cannot resume."""
    from pathlib import Path

    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub._local_folder import get_local_download_paths, write_download_metadata
    from huggingface_hub.file_download import _is_same_or_hub_host, http_get
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    local_dir, endpoint = Path(spec["local_dir"]), spec.get("endpoint")
    url = hf_hub_url(spec["repo"], name, revision=spec["commit"], endpoint=endpoint)
    metadata = get_hf_file_metadata(url, token=token, endpoint=endpoint, retry_on_errors=True)
    headers = build_hf_headers(token=token)
    target = url
    if metadata.xet_file_data is None and metadata.location != url:  # as _get_metadata_or_catch_error does
        target = metadata.location
        if not _is_same_or_hub_host(url, target):
            headers.pop("authorization", None)  # a signed CDN URL
    paths = get_local_download_paths(local_dir, name)
    partial = paths.incomplete_path(metadata.etag)
    with WeakFileLock(paths.lock_path):
        for other in partial.parent.glob(partial.name.split(".")[0] + ".*.incomplete"):
            if other != partial:  # another etag's, or a process-unique one
                other.unlink(missing_ok=True)
        with open(partial, "ab") as handle:
            have = handle.tell()
            if have and (not spec_sha256(spec, name) or (metadata.size is not None and have > metadata.size)):
                handle.truncate(0)
                have = 0
            http_get(target, handle, resume_size=have, headers=headers, expected_size=metadata.size,
                     displayed_filename=name)
        os.replace(partial, paths.file_path)
    write_download_metadata(local_dir=local_dir, filename=name, commit_hash=metadata.commit_hash or spec["commit"],
                            etag=metadata.etag)


def spec_sha256(spec, name):
    for entry in spec["files"]:
        if entry["path"] == name:
            return entry.get("sha256")
    return None


def download_child(spec_path):
    """The child: fetches the names given on stdin, ``workers`` at a time (exit code != 0 on failure)."""
    from concurrent.futures import ThreadPoolExecutor

    with open(spec_path) as handle:
        spec = json.load(handle)
    need = json.load(sys.stdin)
    token = None  # huggingface_hub then reads HF_TOKEN or its own token file, as usual
    if spec.get("token_file"):
        with open(spec["token_file"]) as handle:
            token = handle.read().strip() or None
    with ThreadPoolExecutor(max_workers=max(1, int(spec["workers"]))) as pool:
        for _ in pool.map(lambda name: fetch_file(spec, name, token), need):
            pass


def hashed_by(result):
    """The files a download hashed itself (a dict from site_fetch.py); download_watched returns a count."""
    return result if isinstance(result, dict) else {}


def same_file(path, record):
    """Whether ``path`` still has the size and mtime a record was taken with (the manifest's own rule)."""
    info = stat_or_none(path)
    return info is not None and info.st_size == record["size"] and info.st_mtime_ns == record["mtime_ns"]


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
    ``download_watched``; the unit tests put huggingface_hub's stand-in there). A download that
    hashes while it writes (site_fetch.py) returns ``{name: {"size", "mtime_ns", "sha256"}}`` of the
    files it put in place: those are not read again while their size and mtime are unchanged."""
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
    prehashed = {}  # name -> what the download hashed while it wrote the file
    resumable, stale = sort_partials(folder, wanted, need)
    for path in stale:
        os.remove(path)
    if stale:
        print(f"removed {len(stale)} partial files no run can resume, {human_bytes(sum(stale.values()))}", flush=True)
    if need:
        remove_manifest(manifest_path)
        for name in bad + wrong_size:
            os.remove(os.path.join(folder, name))
        total = sum(wanted[name]["size"] - resumable.get(name, 0) for name in need)
        resumed = f", resuming {len(resumable)} partial files ({human_bytes(sum(resumable.values()))} kept)" if resumable else ""
        print(f"downloading {len(need)} files, {human_bytes(total)}{resumed}", flush=True)
        fetch_started = time.monotonic()
        try:
            prehashed.update(hashed_by(download(spec_path, spec, need, total)))
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
        known = {path: prehashed[name]["sha256"] for name, path in fetched.items()
                 if name in prehashed and same_file(path, prehashed[name])}
        digests = {**hash_files([path for path in fetched.values() if path not in known]), **known}
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
            prehashed.update(hashed_by(download(spec_path, spec, need, sum(wanted[name]["size"] for name in need))))
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
