"""Every heavylift operation against fixtures: arguments + host facts -> exact commands or noop.

Cases: tests/operations/<module>.<operation>/<case>.json (format: tests/pyinfra_fixtures.py).
"""

import copy
import hashlib
import io
import json
import os
import shlex
import socket
import subprocess
import sys
import urllib.error
import zipfile

import pytest
from pyinfra.api import OperationError, StringCommand
from pyinfra.connectors.util import CommandOutput, OutputLine

from operations import checkpoint, readiness, runtime, service
from operations.checkpoint import FolderLinks
from resolve.overlay import PatchError, apply_patch
from operations.runtime import CompleteVenv

PROBE_SCRIPT = __import__("pathlib").Path(readiness.__file__).parent / "scripts" / readiness.PROBE_SCRIPT

if "pyinfra_fixtures" not in sys.modules:  # its asserts explain themselves
    pytest.register_assert_rewrite("pyinfra_fixtures")

from pyinfra_fixtures import case_params, local_pyinfra_host, run_operation, run_operation_case  # noqa: E402


@pytest.mark.parametrize(("target", "case", "data"), case_params("operations"))
def test_operation(target, case, data, tmp_path, monkeypatch):
    run_operation_case(target, data, tmp_path, monkeypatch)


# --- every operation has cases ----------------------------------------------------------------

def test_every_operation_has_cases():
    import inspect
    from importlib import import_module
    from pathlib import Path

    folders = {p.name for p in (Path(__file__).parent / "operations").iterdir() if p.is_dir()}
    for module_name in ("runtime", "weights", "checkpoint", "service", "readiness", "release", "secrets"):
        module = import_module(f"operations.{module_name}")
        for name, value in vars(module).items():
            if callable(value) and hasattr(value, "_inner") and inspect.getmodule(value._inner) is module:
                assert f"{module_name}.{name}" in folders, f"no cases for operation {module_name}.{name}"


# --- checkpoint.apply_patch -------------------------------------------------------------------


PRISTINE = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "quantization_config": {"quant_method": "fp8", "ignore": ["lm_head"], "fmt": {"weights": "e4m3"}},
    "rope_scaling": None,
    "num_layers": 61,
}


@pytest.mark.parametrize(
    ("remove", "set_values", "expected"),
    [
        pytest.param([], {}, PRISTINE, id="empty_patch_is_identity"),
        pytest.param(
            ["quantization_config.ignore", "num_layers"], {},
            {"architectures": ["DeepseekV3ForCausalLM"], "rope_scaling": None,
             "quantization_config": {"quant_method": "fp8", "fmt": {"weights": "e4m3"}}},
            id="remove_nested_and_top_level_keeps_siblings",
        ),
        pytest.param(
            ["absent", "quantization_config.absent", "no.such.parent", "num_layers.child", "rope_scaling.factor",
             "architectures.0"],
            {}, PRISTINE, id="removing_absent_keys_or_through_non_dicts_is_not_an_error",
        ),
        pytest.param(
            [], {"quantization_config.fmt.weights": "e5m2", "max_model_len": 8192},
            {**PRISTINE, "max_model_len": 8192,
             "quantization_config": {**PRISTINE["quantization_config"], "fmt": {"weights": "e5m2"}}},
            id="set_existing_nested_and_new_top_level",
        ),
        pytest.param(
            [], {"a.b.c": 1, "quantization_config.new.deep": [1, 2]},
            {**PRISTINE, "a": {"b": {"c": 1}},
             "quantization_config": {**PRISTINE["quantization_config"], "new": {"deep": [1, 2]}}},
            id="set_creates_missing_parents",
        ),
        pytest.param(
            ["quantization_config"], {"quantization_config.quant_method": "bf16"},
            {**{k: v for k, v in PRISTINE.items() if k != "quantization_config"},
             "quantization_config": {"quant_method": "bf16"}},
            id="removes_apply_before_sets",
        ),
        pytest.param(
            [], {"quantization_config": {"quant_method": "none"}},
            {**PRISTINE, "quantization_config": {"quant_method": "none"}},
            id="set_dict_value_replaces_whole",
        ),
    ],
)
def test_apply_patch(remove, set_values, expected):

    before = copy.deepcopy(PRISTINE)
    patched = apply_patch(PRISTINE, remove, set_values)
    assert patched == expected
    assert PRISTINE == before, "apply_patch must not modify its input"


@pytest.mark.parametrize(
    "dotted", ["num_layers.child", "architectures.x", "rope_scaling.factor", "quantization_config.ignore.x.y"]
)
def test_apply_patch_set_through_non_dict_parent_fails(dotted):
    with pytest.raises(PatchError, match=rf"^cannot set {dotted.replace('.', '[.]')}: a parent key is not a mapping$"):
        apply_patch(PRISTINE, [], {dotted: 1})


def test_apply_patch_result_shares_nothing_with_input():
    patched = apply_patch(PRISTINE, [], {})
    patched["quantization_config"]["ignore"].append("x")
    assert PRISTINE["quantization_config"]["ignore"] == ["lm_head"]


# --- readiness: the wait that serving's FunctionCommand runs ----------------------------------


class ShellHost:
    """run_shell_command answers from a list of (status, stdout, stderr); records the commands."""

    print_prefix = "[gpu1] "

    def __init__(self, answers):
        self.answers = list(answers)
        self.commands = []

    def run_shell_command(self, command, **kwargs):
        self.commands.append(command.get_raw_value() if hasattr(command, "get_raw_value") else command)
        status, stdout, stderr = self.answers.pop(0)
        lines = [OutputLine("stdout", line) for line in stdout.splitlines()]
        lines += [OutputLine("stderr", line) for line in stderr.splitlines()]
        return status, CommandOutput(lines)

    def log_styled(self, message, log_func, **kwargs):
        log_func(self.print_prefix + message)


URL, LOG = "http://127.0.0.1:8000", "tail -n 40 '/var/log/heavy lift/kimi.log'"
GATE = readiness.Gate(
    probe_script="/opt/heavylift/lib/readiness_probe.py", pid_source="pidfile:/run/k.pid", env_file="/p/serve.env",
    status_file="/d/status.json", benchmark_tokens=16,
    meta={"deployment": "kimi", "release": "new000000000", "vllm": "vllm 0.34.0", "model": "org/m@" + "a" * 40},
)
ROLLBACK = readiness.Rollback(
    current_link="/d/current", previous_link="/d/previous", releases_dir="/d/releases",
    restart=(StringCommand("restart-it"),),
)
READY = {"healthy": True, "completion": " Paris.", "error": None, "health_seconds": 42.5, "completion_seconds": 0.3,
         "load_seconds": 44.0, "ttft_seconds": 0.05, "tokens_per_second": 120.5, "benchmark_tokens": 16}


def test_wait_until_ready_logs_endpoint_completion_and_report(caplog):
    host = ShellHost([(True, json.dumps(READY), "")])
    with caplog.at_level("INFO", logger="pyinfra"):
        readiness._wait_until_ready(None, host, URL, "kimi-k2", 1800, "http://gpu1:8000/v1", LOG, GATE)
    assert host.commands == [readiness.probe_command(URL, "kimi-k2", 1800, GATE, write_status=True).get_raw_value()]
    # the key is read on the host from the env file: only its path is in the command
    assert "--env-file /p/serve.env --benchmark 16 --status-file /d/status.json --write-status --meta" in host.commands[0]
    assert caplog.messages == [
        "[gpu1] vLLM healthy after 42.5 s; serving kimi-k2 at http://gpu1:8000/v1; completion in 0.3 s: ' Paris.'",
        f"[gpu1] report: deployment kimi release new000000000 vLLM vllm 0.34.0 model org/m@{'a' * 40} endpoint "
        "http://gpu1:8000/v1 health ok load 44.0 s ttft 0.05 s decode 120.5 tok/s",
    ]


def test_wait_until_ready_fails_with_the_log_when_there_is_no_previous_release():
    answer = {"healthy": False, "completion": None, "error": "/health: timed out", "health_seconds": 1800.1}
    host = ShellHost([(True, json.dumps(answer), ""), (True, "INFO loading\nERROR CUDA out of memory", ""), (True, "", "")])
    with pytest.raises(OperationError) as raised:
        readiness._wait_until_ready(None, host, URL, "kimi-k2", 1800, "http://gpu1:8000/v1", StringCommand(LOG), GATE, ROLLBACK)
    assert str(raised.value) == (
        "vLLM at http://127.0.0.1:8000 is not ready (/health: timed out; waited 1800.1 of 1800 s).\n"
        "Errors in its log:\n  ERROR CUDA out of memory\n"
        "Last lines of its log:\nINFO loading\nERROR CUDA out of memory"
    )
    assert host.commands[1:] == [LOG, "readlink /d/previous"]


def test_failed_gate_rolls_back_restarts_gates_again_and_fails_the_run(caplog):
    failed = {"healthy": False, "completion": None, "error": "vLLM exited while loading (pidfile:/run/k.pid)", "health_seconds": 8.0}
    host = ShellHost([
        (True, json.dumps(failed), ""),
        (True, "vllm: error: unrecognized arguments: --bogus", ""),
        (True, "releases/old000000000", ""),
        (True, "", ""), (True, "", ""), (True, "", ""),  # ln, mv, restart
        # the old release's launcher: it serves another name than the failed one (a site edit changed the model)
        (True, "exec /d/releases/old000000000/venv/bin/python -m vllm.entrypoints.launchers.api_server.entry \\\n"
               "    --served-model-name 'org/kimi-k2-old' --host 0.0.0.0 --port 8000", ""),
        (True, json.dumps(READY), ""),
    ])
    with caplog.at_level("INFO", logger="pyinfra"), pytest.raises(OperationError) as raised:
        readiness._wait_until_ready(None, host, URL, "kimi-k2", 1800, "http://gpu1:8000/v1", StringCommand(LOG), GATE, ROLLBACK)
    assert host.commands[3:7] == [
        "ln -sfn /d/releases/old000000000 /d/current.new", "mv -T /d/current.new /d/current", "restart-it",
        "cat /d/releases/old000000000/serve",
    ]
    # the second gate asks for what the old release serves, and records the release it went back to and the failed one
    gate_again = shlex.split(host.commands[7])
    assert "org/kimi-k2-old" in gate_again and "kimi-k2" not in gate_again
    meta = json.loads(gate_again[-1])
    assert meta["release"] == "old000000000" and meta["rolled_back_from"] == "new000000000"
    message = str(raised.value)
    assert message.startswith("release new000000000 failed its readiness gate and was rolled back: release old000000000 "
                              "serves org/kimi-k2-old at http://gpu1:8000/v1 again (healthy after 42.5 s).")
    assert "unrecognized arguments: --bogus" in message
    assert any("rolling back to release old000000000" in m for m in caplog.messages)


def test_failure_text_leads_with_the_error_lines_of_a_long_log():
    usage = "\n".join(f"    [--option-{n} OPTION_{n}]" for n in range(36))
    log = ("INFO starting\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
           "RuntimeError: Engine core initialization failed\n" + usage +
           "\nvllm: error: unrecognized arguments: --no-such-vllm-flag\nvllm: error: unrecognized arguments: --no-such-vllm-flag")
    text = readiness.failure_text(URL, {"error": "vLLM exited", "health_seconds": 3.0}, 60, log)
    head, _, tail = text.partition("Last lines of its log:\n")
    assert head.splitlines()[1:] == [
        "Errors in its log:",
        "  RuntimeError: Engine core initialization failed",
        "  vllm: error: unrecognized arguments: --no-such-vllm-flag",
    ]
    assert tail == log
    # a log without error lines is shown as it is, with no empty heading
    assert "Errors in its log" not in readiness.failure_text(URL, {"error": "e"}, 60, "INFO loading")


def test_gate_step_fails_the_operation_with_one_message_and_no_traceback(caplog):
    failed = {"healthy": False, "completion": None, "error": "/health: timed out", "health_seconds": 60.0}
    host = ShellHost([(True, json.dumps(failed), ""), (True, "ERROR out of memory", ""), (True, "", "")])
    with caplog.at_level("INFO", logger="pyinfra"):
        passed = readiness._gate_step(None, host, URL, "kimi-k2", 60, "e", StringCommand(LOG), GATE, ROLLBACK)
    assert passed is False
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].getMessage().startswith("[gpu1] vLLM at http://127.0.0.1:8000 is not ready")
    assert "Traceback" not in caplog.text
    ready = ShellHost([(True, json.dumps(READY), "")])
    assert readiness._gate_step(None, ready, URL, "kimi-k2", 60, "e", StringCommand(LOG), GATE) is True


def test_failed_rollback_says_both():
    failed = {"healthy": False, "completion": None, "error": "/health: timed out", "health_seconds": 60.0}
    host = ShellHost([(True, json.dumps(failed), ""), (True, "log", ""), (True, "releases/old000000000", ""),
                      (True, "", ""), (True, "", ""), (True, "", ""), (True, "--served-model-name kimi-k2", ""),
                      (True, json.dumps(failed), "")])
    with pytest.raises(OperationError, match="Rolled back to release old000000000, which is not ready either"):
        readiness._wait_until_ready(None, host, URL, "kimi-k2", 60, "e", StringCommand(LOG), GATE, ROLLBACK)


def test_wait_until_ready_probe_failed_reports_stderr():
    host = ShellHost([(False, "", "python3: not found"), (True, "", "")])
    with pytest.raises(OperationError, match=r"not ready \(python3: not found; waited \? of 60 s\)"):
        readiness._wait_until_ready(None, host, URL, "kimi-k2", 60, "e", LOG, GATE)


def test_wait_until_ready_accepts_an_empty_completion():
    """A 200 completion whose text is empty (the model's first token is EOS) is a real answer:
    the ServingProbe fact counts it as serving (`completion is not None`), so the wait must too."""
    answer = {"healthy": True, "completion": "", "error": None, "health_seconds": 3.0, "completion_seconds": 0.1}
    host = ShellHost([(True, json.dumps(answer), "")])
    readiness._wait_until_ready(None, host, URL, "tiny", 60, "e", LOG, GATE)
    assert len(host.commands) == 1


# --- runtime.local_uv_binary: the uv binary for the host's CPU, no network --------------------


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


# --- round trips on this machine: the commands, run by a shell, reach the state the facts report
# The cases above pin the exact commands; these run them (paths with spaces, quotes and $) and
# check that the next run is a noop, which exact strings alone cannot show.


@pytest.fixture(scope="module")
def local_host():
    return local_pyinfra_host()


@pytest.fixture
def odd_dir(tmp_path):
    folder = tmp_path / "heavy lift" / "it's $HOME"
    folder.mkdir(parents=True)
    return folder


def sh(command: str) -> str:
    return subprocess.run(["sh", "-c", command], check=True, capture_output=True, text=True, env={"PATH": os.environ["PATH"]}).stdout


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


def test_links_commands_converge(local_host, odd_dir):
    content = odd_dir / "hub cache" / "commit"
    (content / "sub dir").mkdir(parents=True)
    names = ["weights 1.safetensors", "tok'en.json", "sub dir/vocab $1.txt"]
    for name in names:
        (content / name).write_text(name)
    overlay = odd_dir / "over lay"
    overlay.mkdir()
    (overlay / "tok'en.json").symlink_to("/older/commit/tok'en.json")
    (overlay / "stale $HOME.json").symlink_to("/older/commit/stale.json")
    (overlay / "config.json").write_text("{}")  # rendered, not a link: left alone

    def links_run():
        facts = {"checkpoint.FolderLinks": {f"path={overlay}": local_host.get_fact(FolderLinks, path=str(overlay))}}
        return run_operation(checkpoint.links, {"path": str(overlay), "target_dir": str(content), "names": names}, facts)

    commands, _ = links_run()
    assert len(commands) == 7
    for command in commands:
        sh(command)
    assert {n: (overlay / n).read_text() for n in names} == {n: n for n in names}
    assert sorted(p.name for p in overlay.iterdir()) == ["config.json", "sub dir", "tok'en.json", "weights 1.safetensors"]

    commands, host = links_run()
    assert (commands, host.noops) == ([], [f"3 links in {overlay} point at {content}"])


def test_daemon_start_command_sources_env_and_execs_launcher(odd_dir):
    launcher, env_file = odd_dir / "serve", odd_dir / "serve.env"
    launcher.write_text('#!/bin/sh\nprintf "%s|%s|%s\\n" "$GREETING" "$PLAIN" "$0"\n')
    launcher.chmod(0o755)
    env_file.write_text("GREETING='hello world'\nPLAIN=$((1+1))\n")
    pidfile, logfile = odd_dir / "run dir" / "vllm.pid", odd_dir / "vllm $1.log"
    kwargs = {"launcher": str(launcher), "env_file": str(env_file), "pidfile": str(pidfile), "logfile": str(logfile),
              "dependencies": []}
    commands, _ = run_operation(service.daemon, kwargs, {"service.DaemonRunning": {f"pidfile={pidfile}": False}})

    sh(commands[0])
    assert pidfile.parent.is_dir()
    # a pidfile a dead (or unreaped) vLLM left would make start-stop-daemon --start start nothing
    pidfile.write_text("4194304\n")
    sh(commands[1])
    assert not pidfile.exists()
    argv = shlex.split(commands[2])
    assert argv[:12] == ["start-stop-daemon", "--start", "--background", "--make-pidfile", "--pidfile", str(pidfile),
                         "--output", str(logfile), "--startas", "/bin/sh", "--", "-c"]
    # what start-stop-daemon would run: /bin/sh -c SCRIPT; the variables reach the exec'd launcher
    out = subprocess.run(["/bin/sh", "-c", argv[12]], check=True, capture_output=True, text=True, env={}).stdout
    assert out == f"hello world|2|{launcher}\n"


def test_probe_stops_waiting_when_the_process_exited(tmp_path):
    """A vLLM that died while loading never answers: the wait ends at once, not after the budget."""
    import subprocess
    import time

    dead = subprocess.Popen(["true"])
    dead.wait()
    pidfile = tmp_path / "serve.pid"
    pidfile.write_text(f"{dead.pid}\n")
    gate = readiness.Gate(probe_script=str(PROBE_SCRIPT), pid_source=f"pidfile:{pidfile}")
    command = readiness.probe_command("http://127.0.0.1:9", "m", 600, gate).get_raw_value()
    started = time.monotonic()
    result = json.loads(subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout)
    assert time.monotonic() - started < 30
    assert result["healthy"] is False and "exited while loading" in result["error"]


def test_wait_health_fails_at_once_when_the_units_main_process_is_gone():
    """ExecStartPost: systemd waits for it even after vLLM died; it must not wait for TimeoutStartSec."""
    import subprocess
    import time

    dead = subprocess.Popen(["true"])
    dead.wait()
    started = time.monotonic()
    waited = subprocess.run([sys.executable, str(PROBE_SCRIPT), "wait-health", "http://127.0.0.1:9"],
                            env={"MAINPID": str(dead.pid)}, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 30
    assert waited.returncode == 1 and f"vLLM (pid {dead.pid}) exited before /health answered" in waited.stderr
    # while the main process lives, it keeps waiting (here: until the timeout ends it, past its second look:
    # it looks every 2 s)
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, str(PROBE_SCRIPT), "wait-health", "http://127.0.0.1:9"],
                       env={"MAINPID": str(os.getpid())}, capture_output=True, timeout=3)


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
