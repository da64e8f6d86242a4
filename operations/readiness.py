"""Readiness: the gate after every (re)start. /health, a real completion, a short decode benchmark.

vLLM binds its port before the engine has loaded and answers only once the model is
ready, so connections are refused or hang for minutes: the probe polls with short timeouts
(docs/field-notes.md, "Serving"; ``/health`` answers 503 when the engine is dead). The probe runs on
the host (``scripts/readiness_probe.py``) and reads the API key from the environment file
there, so the key is never in an argument list or in pyinfra's output.

A gate that fails after a release switch puts the previous release back, restarts it, gates
it again, and fails the run with the last lines of the failed start's log.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from pyinfra import host, logger, state
from pyinfra.api import FactBase, FunctionCommand, OperationError, QuoteString, StringCommand, operation
from pyinfra.api.operation import OperationMeta

from . import hostpython, nodegroup
from .release import link_switch
from .service import changed_in_this_run

PROBE_SCRIPT = "readiness_probe.py"


@dataclass(frozen=True)
class Gate:
    """What the gate needs besides the URL: where the process, the key and the status live."""

    probe_script: str
    pid_source: str = ""  # "pidfile:PATH" or "systemd:UNIT"
    env_file: str = ""
    status_file: str = ""
    benchmark_tokens: int = 0
    meta: dict = field(default_factory=dict)  # deployment, release, vLLM, model: goes into status.json
    # a multi-node group's host names, the leader first (resolve/nodes.py); empty for a host on its own.
    # The group is gated once, on the leader, and rolled back together (operations/nodegroup.py)
    group: tuple[str, ...] = ()
    # where the service's log is, "file:PATH" or "journal:UNIT" (operations/supervisor.py): the gate reads
    # the start-up breakdown from this start's lines of it
    log_source: str = ""


@dataclass(frozen=True)
class Rollback:
    """How to go back to the previous release: switch links, then the restart commands."""

    current_link: str
    previous_link: str
    releases_dir: str
    restart: tuple = ()  # StringCommands that stop and start the service


def probe_command(url: str, model: str, budget_seconds: float, gate: Gate, write_status: bool = False) -> StringCommand:
    args = [hostpython.PYTHON, QuoteString(gate.probe_script), "probe", QuoteString(url), QuoteString(model), str(budget_seconds)]
    if gate.pid_source:
        args += ["--pid-source", QuoteString(gate.pid_source)]
    if gate.env_file:
        args += ["--env-file", QuoteString(gate.env_file)]
    if gate.benchmark_tokens:
        args += ["--benchmark", str(gate.benchmark_tokens)]
    if gate.status_file:
        args += ["--status-file", QuoteString(gate.status_file)]
    if write_status:
        args += ["--write-status", "--meta", QuoteString(json.dumps(gate.meta, sort_keys=True))]
        if gate.log_source:  # a (re)start's gate reads its log; a look carries the figures of that gate
            args += ["--log-source", QuoteString(gate.log_source)]
    return StringCommand(*args)


class ServingProbe(FactBase):
    """One quick look at a vLLM endpoint from the host itself: healthy, a completion, the decode figures."""

    def command(self, url, model, probe_script, pid_source="", env_file="", status_file="", benchmark_tokens=0):
        gate = Gate(probe_script, pid_source, env_file, status_file, benchmark_tokens)
        return probe_command(url, model, 0, gate)

    def process(self, output):
        return json.loads("\n".join(output))


def report_line(meta: dict, result: dict, endpoint: str) -> str:
    """The per-host report: deployment, release (the one the process runs), vLLM, model revision,
    endpoint, health, figures."""

    def seconds(key):
        value = result.get(key)
        return f"{value} s" if value is not None else "?"

    rate = result.get("tokens_per_second")
    if rate is not None:
        decode = f"decode {rate} tok/s"
    elif result.get("decode_note"):
        decode = f"decode - ({result['decode_note']})"
    else:
        decode = "decode -"
    # the release the probe read from the running process (/proc/<pid>/cwd), when it could
    release = result.get("release") or meta.get("release")
    # a look at a running service carries the figures its last gate measured, and says so
    measured = f" (at the gate of {result['figures_at']})" if result.get("figures_at") else ""
    start = f"; {startup_text(result['startup'])}" if result.get("startup") else ""
    return (
        f"report: deployment {meta.get('deployment')} release {release} "
        f"vLLM {meta.get('vllm')} model {meta.get('model')} endpoint {endpoint} "
        f"health {'ok' if result.get('healthy') else 'FAILED'} load {seconds('load_seconds')} "
        f"ttft {seconds('ttft_seconds')} {decode}{start}{measured}"
    )


def startup_text(breakdown: dict) -> str:
    """Where a start went (scripts/readiness_probe.py ``startup``), in one line: seconds from the process start
    to the engine, the API and the first completion, and what each stage of the engine took. A stage vLLM's
    log did not show (no torch.compile with --enforce-eager, no CUDA graphs on a CPU) is "absent"."""

    def at(key):
        return _seconds_or_unknown(breakdown.get(key))

    weights, compiled, kv, graphs = (breakdown.get(k) for k in ("weights", "compile", "kv_cache", "cuda_graphs"))
    parts = [f"start: engine up {at('engine_up_seconds')}"]
    if weights:
        rate = f", {weights['gb_per_s']:g} GB/s" if weights.get("gb_per_s") is not None else ""
        size = f"{weights['gib']:g} GiB in " if weights.get("gib") is not None else ""
        parts.append(f"weights {size}{weights['seconds']:g} s{rate}")
    else:
        parts.append("weights absent")
    if compiled:
        cache = f" (cache {compiled['cache']})" if compiled.get("cache") else ""
        parts.append(f"torch.compile {_seconds_or_unknown(compiled.get('seconds'))}{cache}")
    else:
        parts.append("torch.compile absent")
    if kv:
        size = f"{kv['gib']:g} GiB" if kv.get("gib") is not None else "? GiB"
        tokens = f", {kv['tokens']:,} tokens" if kv.get("tokens") is not None else ""
        parts.append(f"KV cache {size}{tokens}")
    else:
        parts.append("KV cache absent")
    parts.append(f"CUDA graphs {graphs['seconds']:g} s" if graphs else "CUDA graphs absent")
    parts.append(f"engine init {at('init_engine_seconds')}")
    return ", ".join(parts) + f"; API up {at('api_up_seconds')}, first completion {at('first_completion_seconds')}"


def _seconds_or_unknown(value) -> str:
    return f"{value:g} s" if value is not None else "?"


def _gate(host, url, model, budget_seconds, gate):
    status, output = host.run_shell_command(probe_command(url, model, budget_seconds, gate, write_status=True))
    if status and output.stdout.strip():
        return json.loads(output.stdout.strip().splitlines()[-1])
    return {"healthy": False, "completion": None, "error": output.stderr.strip() or "the probe failed"}


def _passed(result: dict) -> bool:
    return result.get("completion") is not None  # "" is a real answer


# lines that say why a start failed: argparse's "vllm: error: ...", a traceback's last line
# ("RuntimeError: CUDA out of memory"), vLLM's own "ERROR ..." log lines, systemd's
# "Failed to execute ...: Permission denied" (status 203/EXEC)
_ERROR_LINE = re.compile(r"\berror\b|\w+(Error|Exception):|Permission denied|Failed to execute", re.IGNORECASE)


def failure_text(url: str, result: dict, budget_seconds: float, log: str) -> str:
    """Why the gate failed, the log's error lines first (a bad flag's tail is mostly usage text),
    then the last lines of the log as they are."""
    # vLLM logs "ERROR ... Traceback (most recent call last):": that line says nothing, the last one does
    errors = [line.strip() for line in log.splitlines() if _ERROR_LINE.search(line) and "Traceback" not in line]
    lead = ""
    if errors:
        lead = "Errors in its log:\n" + "\n".join(f"  {line}" for line in dict.fromkeys(errors[-3:])) + "\n"
    return (
        f"vLLM at {url} is not ready ({result.get('error')}; waited {result.get('health_seconds', '?')} "
        f"of {budget_seconds} s).\n{lead}{processes_text(result.get('processes'))}Last lines of its log:\n{log}"
    )


def processes_text(processes) -> str:
    """The probe's ``processes`` (readiness_probe.py ``process_tree``) as lines: what each process of the start was
    doing when the gate gave up (state, CPU against age, where a sleeper waits)."""
    if not processes:
        return ""
    lines = [
        f"  pid {p['pid']} {p['name']}: {STATES.get(p['state'], p['state'])}, {p['cpu_seconds']:g} s of CPU in "
        f"{p['age_seconds']:g} s" + (f", waiting in {p['waiting_in']}" if p.get("waiting_in") and p["state"] != "R" else "")
        for p in processes
    ]
    return "Its processes when the gate gave up:\n" + "\n".join(lines) + "\n"


# /proc/PID/stat's state letters (proc(5))
STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible I/O", "T": "stopped", "t": "stopped by a tracer",
          "Z": "exited, not reaped"}


def release_of(host, link):
    status, output = host.run_shell_command(StringCommand("readlink", QuoteString(link)))
    return output.stdout.strip().rsplit("/", 1)[-1] if status and output.stdout.strip() else None


def switch_back(host, rollback: Rollback, previous: str, failure: str = "") -> None:
    """``previous`` back as ``current`` (the same atomic link switch that installed the failed one), restarted.
    Raises OperationError (after ``failure``) when a command fails."""
    back = f"{rollback.releases_dir}/{previous}"
    for command in (*link_switch(rollback.current_link, back), *rollback.restart):
        ok, output = host.run_shell_command(command)
        if not ok:
            raise OperationError(f"{failure}\nRollback to release {previous} failed at `{command}`: {output.stderr}")


def put_back(host, url, model, budget_seconds, endpoint, gate: Gate, rollback: Rollback, failed: str, previous: str,
             failure: str = "") -> dict:
    """``previous`` back as ``current``, restarted and gated again; the gate's result. Raises OperationError
    (after ``failure``) when that fails too."""
    switch_back(host, rollback, previous, failure)
    return _gate_again(host, url, model, budget_seconds, endpoint, gate, failed, previous, failure, rollback.releases_dir)


# the served name in a release's launcher (resolve/plan.py always passes --served-model-name, shell-quoted)
SERVED_NAME = re.compile(r"--served-model-name\s+'?([^\s'\\]+)")


def served_name_of(host, releases_dir: str, release: str) -> str | None:
    """The name release ``release`` serves its model under: a release kept from before a site edit may serve another
    model (or name) than the one that just failed."""
    ok, output = host.run_shell_command(StringCommand("cat", QuoteString(f"{releases_dir}/{release}/serve")))
    found = SERVED_NAME.search(output.stdout) if ok else None
    return found.group(1) if found else None


def _gate_again(host, url, model, budget_seconds, endpoint, gate: Gate, failed: str, previous: str, failure: str,
                releases_dir: str = "") -> dict:
    # gated as what that release serves, not as the failed one's model
    model = (served_name_of(host, releases_dir, previous) if releases_dir else None) or model
    again = _gate(host, url, model, budget_seconds, Gate(**{**gate.__dict__, "meta": {
        **gate.meta, "release": previous, "rolled_back_from": failed}}))
    if not _passed(again):
        raise OperationError(
            f"{failure}\nRolled back to release {previous}, which is not ready either ({again.get('error')})."
        )
    logger.info(f"{host.print_prefix}{report_line({**gate.meta, 'release': previous}, again, endpoint)}")
    return {**again, "served": model}


def _wait_until_ready(state, host, url, model, budget_seconds, endpoint, log_command, gate, rollback=None):
    if gate.group and host.name != gate.group[0]:
        return _worker_gate(state, host, url, model, budget_seconds, endpoint, log_command, gate, rollback)
    result = _gate(host, url, model, budget_seconds, gate)
    if _passed(result):
        if gate.group:
            nodegroup.board_of(state).post(gate.meta.get("deployment"), nodegroup.Outcome(passed=True))
        logger.info(
            f"{host.print_prefix}vLLM healthy after {result['health_seconds']} s; serving {model} at {endpoint}; "
            f"completion in {result['completion_seconds']} s: {result['completion']!r}"
        )
        logger.info(f"{host.print_prefix}{report_line(gate.meta, result, endpoint)}")
        return
    _, log = host.run_shell_command(log_command)
    failure = failure_text(url, result, budget_seconds, log.stdout)
    failed = gate.meta.get("release")
    previous = release_of(host, rollback.previous_link) if rollback else None
    if gate.group:
        return _leader_rolls_back(state, host, url, model, budget_seconds, endpoint, gate, rollback, failed, previous,
                                  failure)
    if not previous or previous == failed:
        raise OperationError(failure)

    logger.warning(f"{host.print_prefix}release {failed} failed its readiness gate; rolling back to release {previous}")
    again = put_back(host, url, model, budget_seconds, endpoint, gate, rollback, failed, previous, failure)
    raise OperationError(
        f"release {failed} failed its readiness gate and was rolled back: release {previous} serves {again['served']} at "
        f"{endpoint} again (healthy after {again['health_seconds']} s).\n{failure}"
    )


def _leader_rolls_back(state, host, url, model, budget_seconds, endpoint, gate, rollback, failed, previous, failure):
    """The leader's gate failed: every node of the group goes back to its previous release at once, then the
    leader gates the group again (operations/nodegroup.py)."""
    board, workers = nodegroup.board_of(state), gate.group[1:]
    going_back = bool(previous) and previous != failed
    outcome = nodegroup.Outcome(passed=False, rollback=going_back)
    board.post(gate.meta.get("deployment"), outcome)
    group = ", ".join(gate.group)
    if not going_back:
        raise OperationError(f"{failure}\nThere is no previous release to go back to: the group ({group}) is not serving.")
    logger.warning(f"{host.print_prefix}release {failed} failed its readiness gate; rolling the group ({group}) "
                   f"back together, this node to release {previous}")
    try:
        switch_back(host, rollback, previous, failure)
    finally:
        outcome.restarted.add(host.name)
    # the leader's new start needs its workers restarted on their previous release too
    board.wait(state, gate.meta.get("deployment"), lambda o: set(workers) <= o.restarted, leader=host.name,
               timeout=budget_seconds)
    try:
        again = _gate_again(host, url, model, budget_seconds, endpoint, gate, failed, previous, failure,
                            rollback.releases_dir)
    finally:
        outcome.regate_done = True
    raise OperationError(
        f"release {failed} failed its readiness gate and the group ({group}) was rolled back together: release "
        f"{previous} serves {model} at {endpoint} again (healthy after {again['health_seconds']} s).\n{failure}"
    )


def _worker_gate(state, host, url, model, budget_seconds, endpoint, log_command, gate, rollback):
    """A node other than the leader: the group's gate is the leader's; this node follows its outcome."""
    leader, deployment = gate.group[0], gate.meta.get("deployment")
    board = nodegroup.board_of(state)
    outcome = board.wait(state, deployment, lambda o: True, leader=leader, timeout=budget_seconds + 60)
    if outcome is None:
        raise OperationError(f"the group's leader {leader} did not reach its readiness gate (it failed before it, "
                             f"or took longer than {budget_seconds} s): this node's vLLM waits for it")
    if outcome.passed:
        # the leader serves: this node's own process must be alive, and the leader's API answer from here
        result = _gate(host, url, model, budget_seconds, gate)
        if _passed(result):
            logger.info(f"{host.print_prefix}the group's leader {leader} passed its gate; this node serves with it")
            return
        _, log = host.run_shell_command(log_command)
        raise OperationError(failure_text(url, result, budget_seconds, log.stdout))
    failed = gate.meta.get("release")
    try:
        if not outcome.rollback:
            raise OperationError(f"the group's leader {leader} failed its readiness gate and there is no previous "
                                 "release to go back to: the group is not serving")
        previous = release_of(host, rollback.previous_link)
        if not previous or previous == failed:
            raise OperationError(f"the group's leader {leader} failed its readiness gate; this node has no previous "
                                 "release to go back to")
        logger.warning(f"{host.print_prefix}the group's leader {leader} failed its readiness gate; "
                       f"this node goes back to release {previous} with it")
        switch_back(host, rollback, previous)
    finally:
        outcome.restarted.add(host.name)
    board.wait(state, deployment, lambda o: o.regate_done, leader=leader, timeout=budget_seconds + 60)
    raise OperationError(
        f"release {failed} was rolled back with its group: the leader {leader} failed its readiness gate; this "
        f"node runs release {previous} again (the leader's report says whether the group serves)"
    )


def _gate_step(state, host, *args):
    """The gate as a pyinfra step: a failure is said once, in red, and fails the operation
    (an exception would be printed twice, with a traceback, as an "Unexpected error in Python
    callback": pyinfra 3.10 api/operations.py _run_host_op)."""
    try:
        _wait_until_ready(state, host, *args)
    except OperationError as failure:
        host.log_styled(str(failure), fg="red", log_func=logger.error)
        return False
    return True


@operation()
def serving(url: str, model: str, endpoint: str, budget_seconds: int, log_command: StringCommand,
            gate: Gate, dependencies: list[OperationMeta] | None = None, rollback: Rollback | None = None):
    """
    The readiness gate: vLLM answers /health, a real completion and a short decode benchmark.

    + url: base URL as seen from the host itself (e.g. http://127.0.0.1:8000)
    + model: the served model name
    + endpoint: the OpenAI-compatible endpoint clients use, printed for the operator
    + budget_seconds: how long loading may take
    + log_command: prints the last lines of the service's log, shown when the gate fails
    + gate: probe script, process, env file (API key), status file, benchmark size, report data
    + dependencies: operations that (re)start the service: when one changed, the gate runs
    + rollback: where the previous release is and how to restart it, when the gate fails
    """
    restarted = bool(dependencies) and changed_in_this_run(dependencies)
    if restarted:
        # a group is gated as one: a dry run shows the gate on every node (operations/nodegroup.py)
        nodegroup.group_changes(state, host, gate.group)
    else:
        # a look at a running service: /health and one short completion; the decode benchmark runs only
        # at a (re)start's gate (a site's 256 tokens on every re-run would cost seconds of its GPUs),
        # and the look reports that gate's figures
        probe = host.get_fact(
            ServingProbe, url=url, model=model, probe_script=gate.probe_script, pid_source=gate.pid_source,
            env_file=gate.env_file, status_file=gate.status_file,
        )
        if probe and probe.get("healthy") and probe.get("completion") is not None:
            message = f"serving {model} at {endpoint}; completion: {probe['completion']!r}"
            if state.is_executing:
                logger.info(f"{host.print_prefix}{message}")
                logger.info(f"{host.print_prefix}{report_line(gate.meta, probe, endpoint)}")
            host.noop(message)
            return
    yield FunctionCommand(_gate_step, (url, model, budget_seconds, endpoint, log_command, gate, rollback), {})
