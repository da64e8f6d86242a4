"""operations/neighbours.py: the listening ports from /proc/net/tcp and the launchers through the real fact command on
this machine (what they serve on: tests/test_resolve_neighbours.py)."""

from __future__ import annotations

import socket
import subprocess

from operations.neighbours import HostNeighbours
from resolve.neighbours import read_launcher
from test_resolve_neighbours import rendered_launcher


def test_listening_ports_from_the_real_fact_command(tmp_path):
    """The fact's shell command on this machine: a real listener is found, a closed port is not."""
    (tmp_path / "other" / "releases" / "r1").mkdir(parents=True)
    (tmp_path / "other" / "serve").write_text(rendered_launcher(["--port", "8123"], {}))
    (tmp_path / "other" / "releases" / "r1" / "serve").write_text(rendered_launcher(["--port", "8124"], {}))
    (tmp_path / "other" / "current").symlink_to("releases/r1")
    (tmp_path / "no-launcher").mkdir()
    with socket.socket() as listener, socket.socket() as closed:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        closed.bind(("127.0.0.1", 0))
        command = HostNeighbours().command(str(tmp_path)).get_raw_value()
        output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
        found = HostNeighbours().process(output.splitlines())
        assert listener.getsockname()[1] in found["listening"]
        assert closed.getsockname()[1] not in found["listening"]
    assert sorted(found["launchers"]) == ["other/current/serve", "other/serve"]
    assert read_launcher("other", "", found["launchers"]["other/serve"]).port == 8123
    assert read_launcher("other", "", found["launchers"]["other/current/serve"]).port == 8124
