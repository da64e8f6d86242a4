"""operations/neighbours.py: what another deployment's launcher serves on, read back from the text
heavylift renders (templates/serve.sh.j2 through release.launcher_lines, as deploy.py does), and the
listening ports from /proc/net/tcp through the real fact command on this machine."""

from __future__ import annotations

import shlex
import socket
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.util import get_template

from operations import release
from operations.neighbours import ALL, HostNeighbours, read_launcher

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def rendered_launcher(args: list[str], env: dict[str, str]) -> str:
    """A launcher exactly as deploy.py renders it."""
    return get_template(str(TEMPLATES / "serve.sh.j2")).render(
        deployment="other", repo="heavylift/tiny-llama", commit="a" * 40,
        env_file="/opt/heavylift/deployments/other/private/serve.env", relative=True,
        env_lines=[f"{key}={shlex.quote(value)}" for key, value in sorted(env.items())],
        command_lines=release.launcher_lines(
            ["/opt/heavylift/deployments/other/venv/bin/vllm", "serve", "/opt/heavylift/deployments/other/overlay",
             "--served-model-name", "x y", "--host", "0.0.0.0", *args],
            {"/opt/heavylift/deployments/other/venv": "venv", "/opt/heavylift/deployments/other/overlay": "overlay"},
        ),
    )


@pytest.mark.parametrize(
    "args, env, port, gpus, fraction",
    [
        (["--port", "8001", "--gpu-memory-utilization", "0.3"], {"CUDA_VISIBLE_DEVICES": "0", "HF_HUB_OFFLINE": "1"},
         8001, (0,), 0.3),
        (["--port", "9000"], {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 9000, (4, 5, 6, 7), None),
        (["--port", "8000"], {"HF_HUB_OFFLINE": "1"}, 8000, ALL, None),
        (["--port=8002", "--gpu-memory-utilization=0.55"], {"CUDA_VISIBLE_DEVICES": ""}, 8002, None, 0.55),
    ],
    ids=["one-gpu-fraction", "four-gpus", "all-gpus", "equals-forms-no-gpu"],
)
def test_read_launcher_as_rendered(args, env, port, gpus, fraction):
    neighbour = read_launcher("other", "/x/serve", rendered_launcher(args, env))
    assert (neighbour.port, neighbour.gpus, neighbour.memory_fraction) == (port, gpus, fraction)


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
