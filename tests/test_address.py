"""Addresses in URLs (resolve/address.py): an IPv6 bind_address is bracketed wherever heavylift builds a URL
from it (RFC 3986 section 3.2.2), in the plan's gate and endpoint (tests/test_planning.py), status's lines
and the host script's /health look."""

import importlib.util
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from operations import fleet
from resolve.address import local_url, public_url, url_host

HOST_STATE = Path(__file__).resolve().parent.parent / "operations" / "scripts" / "host_state.py"


@pytest.mark.parametrize("address, expected", [
    ("::1", "[::1]"), ("fd00::5", "[fd00::5]"), ("[::1]", "[::1]"),
    ("10.0.0.5", "10.0.0.5"), ("gpu-node-1.example.internal", "gpu-node-1.example.internal"),
])
def test_an_ipv6_literal_is_bracketed_and_nothing_else(address, expected):
    assert url_host(address) == expected


@pytest.mark.parametrize("bind, local, public", [
    ("::1", "http://[::1]:8000", "http://[::1]:8000"),
    ("fd00::5", "http://[fd00::5]:8000", "http://[fd00::5]:8000"),
    ("::", "http://127.0.0.1:8000", "http://gpu1:8000"),  # every interface: the loopback, the host's name
    ("0.0.0.0", "http://127.0.0.1:8000", "http://gpu1:8000"),
    ("127.0.0.1", "http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("10.0.0.5", "http://10.0.0.5:8000", "http://10.0.0.5:8000"),
])
def test_the_server_as_its_host_and_as_others_reach_it(bind, local, public):
    assert local_url(bind, 8000) == local
    assert public_url(bind, 8000, "gpu1") == public


def test_status_shows_an_ipv6_endpoint_in_brackets():
    state = {"current": "r1", "previous": None, "releases": [{"id": "r1", "port": 8000, "host": "::1"}],
             "service": {"state": "active", "manager": "fallback", "detail": "pid 1"}, "status": {}}
    assert "endpoint http://[::1]:8000/v1" in fleet.deployment_lines("llama", state)[0]


class Healthy(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


class HealthyV6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 on this machine")
def test_the_host_scripts_health_look_reaches_vllm_on_an_ipv6_loopback():
    """status.py's look at /health (operations/scripts/host_state.py, run on the host) for vLLM bound to ::1."""
    try:
        server = HealthyV6(("::1", 0), Healthy)
    except OSError as error:
        pytest.skip(f"no IPv6 loopback here: {error}")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        spec = importlib.util.spec_from_file_location("host_state", HOST_STATE)
        host_state = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(host_state)
        assert host_state.health("::1", server.server_address[1]) == "ok"
    finally:
        server.shutdown()
        server.server_close()
