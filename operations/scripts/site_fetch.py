"""Fetch a pinned snapshot from the site source (a host of the site serving its verified copy), verify it,
then write this host's own manifest.

Runs on the host (standard library, ``curl`` and ``setpriv``). Usage: site_fetch.py SPEC.json, the
request fetch_weights.py takes plus ``"source": {"url", "name", "header_file", "wait_seconds"}``.

1. The source's listing of repo@commit (``/api/models/{repo}/tree/{commit}``: what its manifest
   vouches for) must have every file of the request with the Hub's size, and the Hub's sha256 where
   the Hub gives one; files the Hub gives no sha256 for (a mirror's plain git blobs) take the
   source's, which it computed after checking the size against the Hub. A source that does not
   hold the snapshot yet is asked again every second for ``wait_seconds``.
2. Then fetch_weights.main does what it does for a Hub download (the manifest check, resumable
   and stale partial files, the watchdog with its stall restarts and tries, the manifest written
   only after every file verified) with this script's child as the transfer:
3. the child runs one ``curl --continue-at -`` per file, ``workers`` at a time, into the partial
   file fetch_weights.py resumes (``<short>.<sha256>.incomplete``); each partial file is hashed by a
   thread that follows it as curl writes it (from the page cache: the bytes are read once, while
   the transfer goes on), and renamed into place only when its sha256 matches. A file that does not
   match is deleted and the child fails, so the watchdog fetches it again. curl dies with the child
   (``setpriv --pdeathsig KILL``), the child with fetch_weights.py (PR_SET_PDEATHSIG): a killed run
   leaves no transfer behind, only partial files the next run resumes with a Range request.

The site's token, when it has one, is read by curl from a header file (``-H @file``, curl 7.55+)
and by this script from the same file: never in argv.
"""

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import quote

from fetch_weights import CACHE, download_watched, locked, main as fetch_main, short_hash

BLOCK = 8 * 1024 * 1024
# curl's exit codes (curl(1) "EXIT CODES"): 33 "HTTP range error. The range request did not work"
CURL_RANGE_ERROR = 33


class SourceError(Exception):
    pass


def headers_from(header_file):
    """{name: value} of a curl header file (one ``Name: value`` a line)."""
    found = {}
    if header_file:
        with open(header_file) as handle:
            for line in handle:
                name, colon, value = line.partition(":")
                if colon and name.strip():
                    found[name.strip()] = value.strip()
    return found


def source_listing(source, repo, commit, sleep=time.sleep):
    """{path: {"size", "sha256"}} the source's manifest vouches for; waits ``wait_seconds`` for it."""
    url = f"{source['url']}/api/models/{repo}/tree/{commit}?recursive=true"
    headers = headers_from(source.get("header_file"))
    deadline = time.monotonic() + float(source.get("wait_seconds", 60))
    said = False
    while True:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as answer:
                return {entry["path"]: {"size": entry["size"], "sha256": (entry.get("lfs") or {}).get("oid")}
                        for entry in json.load(answer) if entry.get("type") == "file"}
        except urllib.error.HTTPError as error:
            if error.code == 401:
                raise SourceError(f"the site source {source['name']} ({source['url']}) refused this host's token "
                                  "(HTTP 401). Fix: give every host of the site the same hf_token") from None
            why = (f"holds no verified {repo}@{commit} (HTTP {error.code}): its own download has not finished, "
                   "failed, or ran for another commit")
        except (OSError, ValueError) as error:
            why = f"does not answer ({getattr(error, 'reason', None) or error})"
        if time.monotonic() >= deadline:
            raise SourceError(
                f"the site source {source['name']} ({source['url']}) {why}. Fix: run the deploy with {source['name']} "
                "in it (it fetches from the Hub first and then serves the others), or see its weights step and "
                "its service log")
        if not said:
            print(f"waiting up to {source.get('wait_seconds', 60)} s for the site source {source['name']}: it {why}",
                  flush=True)
            said = True
        sleep(1)


def merge_listing(spec, listing, source):
    """The request's files with the source's sha256 where the Hub gave none; SourceError when the source's
    snapshot is not the Hub's."""
    problems = []
    files = []
    for entry in spec["files"]:
        theirs = listing.get(entry["path"])
        if theirs is None:
            problems.append(f"{entry['path']} is not in its verified snapshot")
        elif theirs["size"] != entry["size"]:
            problems.append(f"{entry['path']} has {theirs['size']} bytes there, the Hub lists {entry['size']}")
        elif entry.get("sha256") and theirs["sha256"] != entry["sha256"]:
            problems.append(f"{entry['path']} has sha256 {theirs['sha256']} there, the Hub lists {entry['sha256']}")
        elif not theirs.get("sha256"):
            problems.append(f"{entry['path']} has no sha256 there")
        files.append({**entry, "sha256": entry.get("sha256") or theirs.get("sha256")})
    if problems:
        raise SourceError(f"the site source {source['name']} ({source['url']}) does not hold the Hub's "
                          f"{spec['repo']}@{spec['commit']}: " + "; ".join(problems[:5]) +
                          ". Fix: run the deploy again so the source re-verifies its copy (verify=full on it)")
    return {**spec, "files": files}


# --- the child: curl per file, hashed while it writes ------------------------------------------------

def partial_path(folder, name, sha256):
    """fetch_weights.py's resumable partial file of ``name``: ``<short>.<etag>.incomplete`` with the
    sha256 as the etag (the Hub's etag of an LFS file is its sha256)."""
    parent, base = os.path.split(os.path.join(folder, CACHE, "huggingface", "download", *name.split("/")))
    return os.path.join(parent, f"{short_hash(base + '.metadata')}.{sha256}.incomplete")


def adopt_partial(path):
    """Keep one partial file per file: another run's under another etag (a Hub download of the same
    commit: the same bytes) becomes ours, every further one goes."""
    parent, base = os.path.split(path)
    prefix = base.split(".")[0] + "."
    others = sorted(n for n in os.listdir(parent) if n.startswith(prefix) and n.endswith(".incomplete") and n != base)
    for other in others:
        if not os.path.exists(path):
            os.replace(os.path.join(parent, other), path)
        else:
            os.remove(os.path.join(parent, other))


class Follower(threading.Thread):
    """sha256 of a file that another process appends to, read as it grows, up to ``size`` bytes."""

    def __init__(self, path, size):
        super().__init__(daemon=True)
        self.path, self.size = path, size
        self.writer_done = threading.Event()
        self.digest = None

    def run(self):
        # one buffer, read into (no allocation per block: eight threads mapping and unmapping 8 MiB
        # blocks spend more time in the kernel than in sha256); hashlib releases the GIL while it hashes
        digest, have = hashlib.sha256(), 0
        buffer = memoryview(bytearray(BLOCK))
        while not os.path.exists(self.path):  # curl creates it
            if self.writer_done.is_set() and not os.path.exists(self.path):
                return
            time.sleep(0.005)
        with open(self.path, "rb", buffering=0) as handle:
            while have < self.size:
                count = handle.readinto(buffer[:min(BLOCK, self.size - have)])
                if not count and self.writer_done.is_set():
                    # what came in just before the writer ended, else nothing more will
                    count = handle.readinto(buffer[:min(BLOCK, self.size - have)])
                    if not count:
                        break
                if count:
                    digest.update(buffer[:count])
                    have += count
                else:
                    time.sleep(0.005)
        self.digest = digest.hexdigest() if have == self.size else None


def write_metadata(folder, name, commit, etag):
    """huggingface_hub 2.4.0's download metadata (``_local_folder.write_download_metadata``: commit, etag,
    time, one a line), so the folder ends as its downloads leave one."""
    path = os.path.join(folder, CACHE, "huggingface", "download", *name.split("/")) + ".metadata"
    with open(path, "w") as handle:
        handle.write(f"{commit}\n{etag}\n{time.time()}\n")


def curl_command(url, partial, header_file, resume=True):
    command = ["setpriv", "--pdeathsig", "KILL", "--", "curl", "--silent", "--show-error", "--fail",
               "--connect-timeout", "10", "--output", partial]
    if resume:
        command += ["--continue-at", "-"]
    if header_file:
        command += ["--header", f"@{header_file}"]
    return command + ["--", url]


def download_child(spec_path):
    """Fetch the names given on stdin, ``workers`` at a time; exit 1 when any failed (kept to resume)."""
    with open(spec_path) as handle:
        spec = json.load(handle)
    need = json.load(sys.stdin)
    folder, source = spec["local_dir"], spec["source"]
    wanted = {entry["path"]: entry for entry in spec["files"]}
    workers = max(1, int(spec["workers"]))
    queue, running, failed = list(need), {}, []
    log = open(spec_path + ".verified", "a")

    def start(name, resume=True):
        want = wanted[name]
        partial = partial_path(folder, name, want["sha256"])
        os.makedirs(os.path.dirname(partial), exist_ok=True)
        adopt_partial(partial)
        have = os.path.getsize(partial) if os.path.exists(partial) else 0
        if have > want["size"] or not resume or have == 0:
            # curl makes the file itself: an existing file truncated and rewritten is flushed to disk on
            # close (ext4 auto_da_alloc, ext4(5)), measured 4.5x slower for 1 GB on loopback
            if os.path.exists(partial):
                os.remove(partial)
            have = 0
        follower = Follower(partial, want["size"])
        follower.start()
        process = None
        if have < want["size"]:
            url = f"{source['url']}/{spec['repo']}/resolve/{spec['commit']}/{quote(name)}"
            # from the main thread: --pdeathsig ties curl to this thread, which lives as long as the child
            process = subprocess.Popen(curl_command(url, partial, source.get("header_file"), resume=have > 0),
                                       stdin=subprocess.DEVNULL)
        running[name] = (process, follower, partial)

    def finish(name, code):
        process, follower, partial = running.pop(name)
        follower.writer_done.set()
        follower.join()
        want = wanted[name]
        if code == CURL_RANGE_ERROR:  # a source that ignores Range: from byte 0
            return start(name, resume=False)
        if code != 0:
            failed.append(f"{name}: curl exited with code {code}")
            return
        if follower.digest != want["sha256"]:
            print(f"FAILED {name}: sha256 {follower.digest} of the bytes received, expected {want['sha256']}: "
                  "fetching it again", flush=True)
            os.remove(partial)
            failed.append(f"{name}: sha256 mismatch")
            return
        final = os.path.join(folder, *name.split("/"))
        os.makedirs(os.path.dirname(final), exist_ok=True)
        os.replace(partial, final)
        write_metadata(folder, name, spec["commit"], want["sha256"])
        info = os.stat(final)
        log.write(json.dumps({"path": name, "size": info.st_size, "mtime_ns": info.st_mtime_ns,
                              "sha256": follower.digest}) + "\n")
        log.flush()

    while queue or running:
        while queue and len(running) < workers:
            start(queue.pop(0))
        for name, (process, _follower, _partial) in list(running.items()):
            code = 0 if process is None else process.poll()
            if code is not None:
                finish(name, code)
        time.sleep(0.01)
    log.close()
    if failed:
        sys.exit("; ".join(failed[:5]))


def download_from_source(spec_path, spec, need, total):
    """The ``download`` fetch_weights.main calls: the watched child above; returns what it hashed."""
    log_path = spec_path + ".verified"
    if os.path.exists(log_path):
        os.remove(log_path)
    download_watched(spec_path, spec, need, total,
                     command=[sys.executable, os.path.abspath(__file__), "--download", spec_path])
    hashed = {}
    with open(log_path) as handle:
        for line in handle:
            record = json.loads(line)
            hashed[record["path"]] = record
    os.remove(log_path)
    return hashed


def main(spec_path):
    with open(spec_path) as handle:
        spec = json.load(handle)
    source = spec["source"]
    print(f"site source {source['name']} ({source['url']}): asking for its verified "
          f"{spec['repo']}@{spec['commit']}", flush=True)
    try:
        merged = merge_listing(spec, source_listing(source, spec["repo"], spec["commit"]), source)
    except SourceError as error:
        sys.exit(str(error))
    # the request with every sha256 known (fetch_weights.main resumes partial files only for those),
    # beside the uploaded one, which stays as the control machine wrote it
    merged_path = spec_path.removesuffix(".json") + ".from-source.json"
    with open(merged_path + ".tmp", "w") as handle:
        json.dump(merged, handle, indent=1)
    os.replace(merged_path + ".tmp", merged_path)
    lock = locked(spec["manifest"])  # noqa: F841 (held for the process's life)
    fetch_main(merged_path, download=download_from_source)


if __name__ == "__main__":
    if sys.argv[1] == "--download":
        download_child(sys.argv[2])
    else:
        main(sys.argv[1])
