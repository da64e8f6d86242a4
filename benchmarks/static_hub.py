"""A minimal Hub-compatible file server for the download benchmark: a folder served at one commit.

olah (the tests' mirror) reads every blob through `git cat-file` in Python and tops out far below
what the clients can take, so the download benchmark would time olah. This serves only what
huggingface_hub 2.4.0 asks for when given a full 40-hex revision (FACTS: "what the client needs
from any Hub-like server"), with the files' bytes sent by os.sendfile:

- GET /api/models/{repo}/revision/{rev}: {"id", "sha"}
- GET /api/models/{repo}/tree/{sha}?recursive=true: files with size and LFS sha256
- HEAD/GET /{repo}/resolve/{sha}/{path}: X-Repo-Commit, ETag / X-Linked-Etag, X-Linked-Size, bytes
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


class StaticHub:
    def __init__(self, folder: Path, repo: str, commit: str | None = None, port: int = 0):
        self.folder, self.repo = Path(folder), repo
        self.files = {}
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
                size, sha = hub.files[match.group(1)]
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.send_header("ETag", f'"{sha}"')
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(size))
                self.send_header("X-Repo-Commit", hub.commit)
                self.end_headers()
                if send_body:
                    with open(hub.folder / match.group(1), "rb") as handle:
                        offset = 0
                        while offset < size:
                            offset += os.sendfile(self.wfile.fileno(), handle.fileno(), offset, size - offset)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

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
