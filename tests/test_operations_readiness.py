"""operations/readiness.py: the readiness gate serving's FunctionCommand runs: the probe, its report, the failure
text, and the rollback to the previous release when the gate fails."""

import json
import os
import shlex
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pyinfra.api import OperationError, StringCommand
from pyinfra.connectors.util import CommandOutput, OutputLine

from operations import readiness
from operations.readiness import ServingProbe, report_line

PROBE_SCRIPT = str(Path(readiness.__file__).parent / "scripts" / readiness.PROBE_SCRIPT)


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
    # 15 timed tokens, each sent 5 ms or more after the one before: about 200 tok/s at most, measured where
    # they are read, so a first read that comes late shortens the span (204.4 tok/s seen on a loaded machine)
    assert probe["benchmark_tokens"] == 16 and probe["ttft_seconds"] >= 0 and 50 < probe["tokens_per_second"] <= 250
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


def test_failure_text_of_a_start_that_hung_says_what_its_processes_were_doing():
    hung = [{"pid": 10, "name": "python -m vllm.entrypoints.openai.api_server", "state": "S", "cpu_seconds": 14.0,
             "age_seconds": 900.4, "waiting_in": "do_epoll_wait"},
            {"pid": 11, "name": "VLLM::EngineCore", "state": "S", "cpu_seconds": 9.5, "age_seconds": 890.1,
             "waiting_in": "pipe_read"},
            {"pid": 12, "name": "VLLM::Worker", "state": "R", "cpu_seconds": 880.0, "age_seconds": 889.9,
             "waiting_in": "0"}]
    text = readiness.failure_text(URL, {"error": "timed out", "health_seconds": 900.5, "processes": hung}, 900, "INFO x")
    head, _, _ = text.partition("Last lines of its log:\n")
    assert head.splitlines()[1:] == [
        "Its processes when the gate gave up:",
        "  pid 10 python -m vllm.entrypoints.openai.api_server: sleeping, 14 s of CPU in 900.4 s, waiting in do_epoll_wait",
        "  pid 11 VLLM::EngineCore: sleeping, 9.5 s of CPU in 890.1 s, waiting in pipe_read",
        "  pid 12 VLLM::Worker: running, 880 s of CPU in 889.9 s",
    ]
