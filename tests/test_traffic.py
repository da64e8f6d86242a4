"""testbed/traffic.py: how a request is classed (against a small local server that streams, refuses or breaks
off) and what the report computes from requests and health samples."""

import http.server
import json
import threading
import time

import pytest

from testbed.ssh_hosts import find_free_port
from testbed.traffic import Outage, Report, Request, Traffic, max_overlap


class Server(http.server.ThreadingHTTPServer):
    # "ok": a whole stream; "merged": the same 2 tokens in one event, as vLLM merges them when it falls behind;
    # "drain": 503; "break": the stream stops after two tokens
    mode = "ok"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200 if self.server.mode == "ok" else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        mode = self.server.mode  # once per request: the test switches it while requests run
        if mode == "drain":
            body = b'{"error": "draining"}'
            self.send_response(503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for text in ["x x"] if mode == "merged" else ["x", "x"]:
            self.wfile.write(b"data: " + json.dumps({"choices": [{"text": text}]}).encode() + b"\n\n")
            self.wfile.flush()
        if mode in ("ok", "merged"):
            usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}
            self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        self.close_connection = True


@pytest.fixture
def server():
    srv = Server(("127.0.0.1", find_free_port()), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize(("mode", "outcome", "tokens"), [
    ("ok", "ok", 2), ("merged", "ok", 2), ("drain", "refused", 0), ("break", "broken", 2)])
def test_a_request_is_ok_refused_or_broken_by_what_the_server_did(server, mode, outcome, tokens):
    server.mode = mode
    traffic = Traffic({"a": f"http://127.0.0.1:{server.server_address[1]}"}, model="m")
    request = traffic.complete("a")
    assert (request.outcome, request.tokens) == (outcome, tokens), request
    if mode == "drain":
        assert request.detail.startswith("HTTP 503"), request.detail


def test_a_closed_port_is_refused():
    traffic = Traffic({"a": f"http://127.0.0.1:{find_free_port()}"}, model="m")
    request = traffic.complete("a")
    assert request.outcome == "refused" and "ConnectionRefused" in request.detail, request


def test_a_short_load_counts_its_requests_and_samples_the_health(server):
    with Traffic({"a": f"http://127.0.0.1:{server.server_address[1]}"}, model="m", streams=2) as load:
        wait_for(lambda: load_seen(load, "ok"))
        server.mode = "drain"
        wait_for(lambda: load_seen(load, "refused") and load.samples_of("a")[-1:] == [False])
        server.mode = "ok"
        wait_for(lambda: load.samples_of("a")[-1:] == [True])
    report = load.report()
    assert report.of("ok") and report.of("refused") and not report.of("broken")
    # one outage, while the server drained (the load's threads run late on a busy machine: no tight bounds)
    assert len(report.outages) == 1 and report.outages[0].seconds > 0, report.outages
    assert report.samples >= 3


def load_seen(load, outcome) -> bool:
    return any(r.outcome == outcome for r in load.requests_so_far())


def wait_for(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within 30 s"
        time.sleep(0.02)


def test_outages_that_only_touch_do_not_overlap():
    assert max_overlap([Outage("a", 0, 5), Outage("b", 5, 9)]) == 1
    assert max_overlap([Outage("a", 0, 5), Outage("b", 4, 9), Outage("c", 4.5, 4.6)]) == 3
    assert max_overlap([]) == 0


def test_the_report_finds_refusals_outside_an_outage():
    requests = [
        Request("a", 0.0, 9.0, "ok"),
        Request("a", 2.0, 2.1, "refused"),
        Request("a", 3.0, 3.1, "refused"),
        Request("b", 1.0, 1.5, "ok"),
        Request("b", 50.0, 50.1, "refused"),  # b was never out then
    ]
    report = Report(requests=requests, outages=[Outage("a", 2.5, 8.0)], samples=10, seconds=60, hosts=("a", "b"))
    assert report.refused_outside_outages(slack=1) == [requests[4]]
    assert report.longest_outage.seconds == 5.5
