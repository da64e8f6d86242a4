"""A stand-in for a multi-node vLLM group's API, for the group rollout's tests (tests/test_nodegroup.py).

    python3 stub_vllm.py PORT [WORKER_PIDFILE ...]

Started from a release folder (as heavylift's launcher starts vLLM: ``cd`` into it). ``/health``
answers 200 and ``/v1/completions`` a completion only while every worker's pidfile names a live
process started from a release of the same generation as this one (the name up to a "+": "r1" and
"r1+w" are one generation, a worker-only change): a tensor/pipeline-parallel group whose nodes run
different releases does not serve (it hangs), and a test can tell.
"""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RELEASE = os.path.basename(os.getcwd())
GENERATION = RELEASE.split("+")[0]
WORKER_PIDFILES = sys.argv[2:]


def release_of(pidfile):
    try:
        with open(pidfile) as handle:
            pid = int(handle.read().split()[0])
        return os.path.basename(os.readlink(f"/proc/{pid}/cwd"))
    except (OSError, ValueError, IndexError):
        return None


def group_whole():
    return all((release_of(pidfile) or "").split("+")[0] == GENERATION for pidfile in WORKER_PIDFILES)


class Handler(BaseHTTPRequestHandler):
    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health" and group_whole():
            self.answer(200, {})
        else:
            self.answer(503, {"error": "the group is not whole"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/completions" and group_whole():
            self.answer(200, {"choices": [{"text": f" Paris (release {RELEASE})"}]})
        else:
            self.answer(503, {"error": "the group is not whole"})

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
