"""A minimal Hub-compatible file server for the download benchmark: a folder served at one commit.

olah (the tests' mirror) reads every blob through `git cat-file` in Python and tops out far below
what the clients can take, so the download benchmark would time olah. This serves only what
huggingface_hub 2.4.0 asks for when given a full 40-hex revision (docs/weights.md, "Site source":
the requests and the client code that makes them), with the files' bytes sent by os.sendfile:

- GET /api/models/{repo}/revision/{rev}: {"id", "sha"}
- GET /api/models/{repo}/tree/{sha}?recursive=true: files with size and LFS sha256
- HEAD/GET /{repo}/resolve/{sha}/{path}: X-Repo-Commit, ETag / X-Linked-Etag, X-Linked-Size, bytes;
  a GET with ``Range: bytes=N-`` (or ``N-M``) gets 206 and those bytes, as the Hub's CDN answers

It counts what it sends: ``served[path]`` (body bytes written to the socket) and ``ranges`` (the
Range headers seen, as ``(path, header)``), for tests that measure what a resumed download refetches.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


class StaticHub:
    def __init__(self, folder: Path, repo: str, commit: str | None = None, port: int = 0, token: str | None = None):
        # token: a gated repository, as the Hub answers without access (401, X-Error-Code GatedRepo)
        self.folder, self.repo, self.token = Path(folder), repo, token
        self.files = {}
        self.served: dict[str, int] = {}
        self.ranges: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.active = 0  # file bodies being sent right now (a killed client's may still be draining)
        for path in sorted(p for p in self.folder.rglob("*") if p.is_file()):
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                while chunk := handle.read(8 << 20):
                    digest.update(chunk)
            self.files[str(path.relative_to(self.folder))] = (path.stat().st_size, digest.hexdigest())
        # no commit given: one derived from the files (the same files, the same commit)
        self.commit = commit or hashlib.sha1(json.dumps(sorted(self.files.items())).encode()).hexdigest()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                self.answer(send_body=False)

            def do_GET(self):
                self.answer(send_body=True)

            def json(self, data, send_body):
                body = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

            def answer(self, send_body):
                path = unquote(urlparse(self.path).path)
                if hub.token is not None and self.headers.get("Authorization") != f"Bearer {hub.token}":
                    self.send_response(401)
                    self.send_header("X-Error-Code", "GatedRepo")
                    self.send_header("X-Error-Message", f"Access to model {hub.repo} is restricted.")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if re.fullmatch(rf"/api/models/{re.escape(hub.repo)}/revision/[^/]+", path):
                    return self.json({"id": hub.repo, "sha": hub.commit}, send_body)
                if path.startswith(f"/api/models/{hub.repo}/tree/{hub.commit}"):
                    return self.json([
                        {"type": "file", "oid": sha[:40], "size": size, "path": name,
                         "lfs": {"oid": sha, "size": size, "pointerSize": 134}}
                        for name, (size, sha) in hub.files.items()
                    ], send_body)
                match = re.fullmatch(rf"/{re.escape(hub.repo)}/resolve/{hub.commit}/(.+)", path)
                if not match or match.group(1) not in hub.files:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                name = match.group(1)
                size, sha = hub.files[name]
                start, end = 0, size
                wanted = self.headers.get("Range") if send_body else None
                if wanted:
                    with hub.lock:
                        hub.ranges.append((name, wanted))
                    bounds = re.fullmatch(r"bytes=(\d+)-(\d*)", wanted.strip())
                    if not bounds or int(bounds.group(1)) >= size:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    start = int(bounds.group(1))
                    end = min(size, int(bounds.group(2)) + 1) if bounds.group(2) else size
                self.send_response(206 if wanted else 200)
                if wanted:
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(end - start))
                self.send_header("ETag", f'"{sha}"')
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(size))
                self.send_header("X-Repo-Commit", hub.commit)
                self.end_headers()
                if send_body:
                    with hub.lock:
                        hub.active += 1
                    with open(hub.folder / name, "rb") as handle:
                        offset = start
                        try:
                            # at most 1 MiB a call: a blocking sendfile of a whole shard returns only when all of
                            # it is sent, and the count would jump at the end (or land after a reset)
                            while offset < end:
                                sent = os.sendfile(self.wfile.fileno(), handle.fileno(), offset, min(end - offset, 1 << 20))
                                offset += sent
                                with hub.lock:
                                    hub.served[name] = hub.served.get(name, 0) + sent
                        except OSError:  # the client went away (a killed download)
                            self.close_connection = True
                        finally:
                            with hub.lock:
                                hub.active -= 1

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """True once no file body is being sent (a killed client's responses have ended)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.active == 0:
                    return True
            time.sleep(0.05)
        return False

    def reset_counts(self) -> None:
        with self.lock:
            self.served, self.ranges = {}, []

    def __enter__(self) -> StaticHub:
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.server.shutdown()
        self.server.server_close()



def main(argv: list[str] | None = None) -> None:
    """Serve one folder as one Hub repository on loopback until killed (the GPU proof's Hub)."""
    import argparse

    parser = argparse.ArgumentParser(description="Serve a folder as a Hub repository at one commit, on 127.0.0.1")
    parser.add_argument("folder", type=Path)
    parser.add_argument("repo", help="org/name")
    parser.add_argument("port", type=int)
    args = parser.parse_args(argv)
    hub = StaticHub(args.folder, args.repo, port=args.port)
    print(json.dumps({"repo": hub.repo, "commit": hub.commit, "url": hub.url, "files": len(hub.files),
                      "bytes": sum(size for size, _ in hub.files.values())}), flush=True)
    try:
        hub.server.serve_forever()
    finally:
        hub.server.server_close()


if __name__ == "__main__":
    main()
