"""The site source: serve this host's verified Hub snapshots to the other hosts of the site.

Runs on the source host as a supervised service (standard library only):

    site_source_server.py --models /opt/heavylift/models --bind 0.0.0.0 --port 8391

A Hub-compatible endpoint over ``<models>/<org>--<name>/<commit>/``, answering what
huggingface_hub 2.4.0 asks of a Hub given a full 40-hex revision (``HfApi.model_info`` /
``list_repo_tree``, ``get_hf_file_metadata`` and ``http_get``; ``hf_api.py``, ``file_download.py``)
and what heavylift's site_fetch.py asks:

- ``GET /api/models/{repo}/revision/{commit}``: ``{"id", "sha", "siblings"}``
- ``GET /api/models/{repo}/tree/{commit}[?recursive=true]``: every file with its size and sha256 (as
  the Hub's ``lfs`` entry)
- ``HEAD``/``GET /{repo}/resolve/{commit}/{path}``: ``X-Repo-Commit``, ``ETag`` (the sha256), the
  bytes; ``Range: bytes=N-`` / ``N-M`` answers 206 with those bytes (os.sendfile, no copy in Python)
- ``GET /heavylift/health``: 200

Only what a manifest vouches for is served. A snapshot is visible once
``<commit>.manifest.json`` exists (fetch_weights.py writes it after every file verified, by a
rename, and removes it before it changes the folder); a file is served only when it is listed
there and the open file still has the manifest's size and mtime (checked on the open file
descriptor, so a file replaced between the check and the send is not served). A partial file, a
snapshot being fetched or re-verified, anything outside the listed files (``.cache``, other
folders) answers 404. Peers verify every byte against the sha256 anyway.

When ``HEAVYLIFT_SITE_SOURCE_TOKEN`` is set in the environment (the service's environment file,
never argv), every request must carry ``Authorization: Bearer <token>``; others get 401.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import re
import stat
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

COMMIT = re.compile(r"^[0-9a-f]{40}$")
PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# bytes per sendfile call: big enough to cost nothing per call, small enough that the byte
# counters move while a shard is sent
SEND_CHUNK = 4 << 20
TOKEN_ENV = "HEAVYLIFT_SITE_SOURCE_TOKEN"


class Snapshots:
    """The verified snapshots under one models folder, read through their manifests."""

    def __init__(self, models: str):
        self.models = models
        self._cache: dict[str, tuple[tuple, dict | None]] = {}
        self._lock = threading.Lock()

    def content(self, repo: str, commit: str) -> str:
        return os.path.join(self.models, repo.replace("/", "--"), commit)

    def manifest(self, repo: str, commit: str) -> dict | None:
        """The manifest's files (name -> {size, sha256, mtime_ns}) of repo@commit, or None when there is none."""
        if not COMMIT.match(commit):
            return None
        path = self.content(repo, commit) + ".manifest.json"
        try:
            info = os.stat(path)
        except OSError:
            return None
        key = (info.st_ino, info.st_size, info.st_mtime_ns)
        with self._lock:
            cached = self._cache.get(path)
            if cached and cached[0] == key:
                return cached[1]
        try:
            with open(path) as handle:
                data = json.load(handle)
            files = data["files"] if data.get("repo") == repo and data.get("commit") == commit else None
        except (OSError, ValueError, KeyError, TypeError):
            files = None
        with self._lock:
            self._cache[path] = (key, files)
        return files

    def open_verified(self, repo: str, commit: str, name: str):
        """(open file, manifest entry) of a file the manifest vouches for as it is now; None otherwise."""
        files = self.manifest(repo, commit)
        if files is None or name not in files:
            return None
        entry = files[name]
        try:
            handle = open(os.path.join(self.content(repo, commit), name), "rb")
        except OSError:
            return None
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size != entry["size"] or info.st_mtime_ns != entry["mtime_ns"]:
            handle.close()  # changed since it was verified: the manifest no longer vouches for it
            return None
        return handle, entry


def split_repo_path(path: str, prefix: str):
    """('org/name', rest) of ``/prefix/org/name/rest``; None when the repo part is not a repo id."""
    parts = path[len(prefix):].split("/", 2) if path.startswith(prefix) else []
    if len(parts) < 3 or not PART.match(parts[0]) or not PART.match(parts[1]):
        return None
    return f"{parts[0]}/{parts[1]}", parts[2]


class SiteSourceServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, models: str, bind: str, port: int, token: str | None = None):
        self.snapshots = Snapshots(models)
        self.token = token or None
        self.counter_lock = threading.Lock()
        self.served: dict[str, int] = {}  # "repo@commit/path" -> body bytes sent (tests and the log)
        self.refused: list[tuple[str, str]] = []  # (path asked, why) of every 401/404
        super().__init__((bind, port), Handler)

    def count(self, key: str, sent: int) -> None:
        with self.counter_lock:
            self.served[key] = self.served.get(key, 0) + sent

    def refuse(self, path: str, why: str) -> None:
        with self.counter_lock:
            self.refused.append((path, why))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: SiteSourceServer

    def log_message(self, *args):  # one line per refusal instead (stderr: the service's log)
        pass

    def do_HEAD(self):
        self.answer(send_body=False)

    def do_GET(self):
        self.answer(send_body=True)

    def empty(self, code: int, why: str, headers: dict | None = None):
        self.server.refuse(self.path, why)
        body = json.dumps({"error": why}).encode()
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def json(self, data, send_body: bool):
        body = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def authorised(self) -> bool:
        if self.server.token is None:
            return True
        given = self.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self.server.token}".encode())

    def answer(self, send_body: bool):
        path = unquote(urlparse(self.path).path)
        if path == "/heavylift/health":
            return self.json({"status": "ok"}, send_body)
        if not self.authorised():
            return self.empty(401, "this site source needs the site's token (Authorization: Bearer)")
        if path.startswith("/api/models/"):
            return self.api(path, send_body)
        found = split_repo_path(path, "/")
        if found and found[1].startswith("resolve/"):
            commit, _, name = found[1][len("resolve/"):].partition("/")
            return self.resolve(found[0], commit, name, send_body)
        return self.empty(404, "not a Hub path this site source serves")

    def api(self, path: str, send_body: bool):
        found = split_repo_path(path, "/api/models/")
        if not found:
            return self.empty(404, "not a repository path")
        repo, rest = found
        kind, _, rest = rest.partition("/")
        commit = rest.split("/", 1)[0]
        files = self.server.snapshots.manifest(repo, commit)
        if files is None:
            # huggingface_hub turns this header into RevisionNotFoundError (utils/_http.py hf_raise_for_status)
            return self.empty(404, f"{repo}@{commit} is not a verified snapshot on this site source",
                              {"X-Error-Code": "RevisionNotFound"})
        if kind == "revision":
            return self.json({"id": repo, "sha": commit, "siblings": [{"rfilename": n} for n in sorted(files)]}, send_body)
        if kind == "tree":
            return self.json([
                {"type": "file", "oid": entry["sha256"][:40], "size": entry["size"], "path": name,
                 "lfs": {"oid": entry["sha256"], "size": entry["size"], "pointerSize": 134}}
                for name, entry in sorted(files.items())
            ], send_body)
        return self.empty(404, f"/api/models/{{repo}}/{kind} is not served here")

    def resolve(self, repo: str, commit: str, name: str, send_body: bool):
        opened = self.server.snapshots.open_verified(repo, commit, name)
        if opened is None:
            return self.empty(404, f"{repo}@{commit}/{name} is not a verified file on this site source",
                              {"X-Error-Code": "EntryNotFound"})
        handle, entry = opened
        with handle:
            size = entry["size"]
            start, end = 0, size
            wanted = self.headers.get("Range") if send_body else None
            if wanted:
                bounds = re.fullmatch(r"bytes=(\d+)-(\d*)", wanted.strip())
                if not bounds or int(bounds.group(1)) >= size:
                    return self.empty(416, "range not satisfiable", {"Content-Range": f"bytes */{size}"})
                start = int(bounds.group(1))
                end = min(size, int(bounds.group(2)) + 1) if bounds.group(2) else size
            self.send_response(206 if wanted else 200)
            if wanted:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
            etag = f'"{entry["sha256"]}"'
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(end - start))
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("ETag", etag)
            self.send_header("X-Linked-Etag", etag)
            self.send_header("X-Linked-Size", str(size))
            self.send_header("X-Repo-Commit", commit)
            self.end_headers()
            if not send_body:
                return
            key, offset = f"{repo}@{commit}/{name}", start
            try:
                while offset < end:
                    sent = os.sendfile(self.wfile.fileno(), handle.fileno(), offset, min(end - offset, SEND_CHUNK))
                    if sent == 0:
                        break
                    offset += sent
                    self.server.count(key, sent)
            except OSError:  # the peer went away (a killed or restarted fetch)
                self.close_connection = True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True, help="the models folder: <models>/<org>--<name>/<commit>/")
    parser.add_argument("--bind", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8391)
    args = parser.parse_args(argv)
    server = SiteSourceServer(args.models, args.bind, args.port, os.environ.get(TOKEN_ENV))
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} site source: serving the verified snapshots of "
          f"{args.models} on {args.bind}:{args.port}{' (token required)' if server.token else ''}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
