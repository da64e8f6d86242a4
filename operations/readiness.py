"""Readiness: the run is done when vLLM answers /health and returns one real completion.

vLLM binds its port before the engine has loaded and answers only once the model is
ready, so connections are refused or hang for minutes: poll with short timeouts
(FACTS, vLLM serving; ``/health`` answers 503 when the engine is dead).
"""

from __future__ import annotations

import json

from pyinfra import host, logger, state
from pyinfra.api import FactBase, FunctionCommand, OperationError, QuoteString, StringCommand, operation

PROBE = r"""
import json, os, sys, time, urllib.request, urllib.error
url, model, budget = sys.argv[1], sys.argv[2], float(sys.argv[3])
pidfile = sys.argv[4] if len(sys.argv) > 4 else ""

def exited():
    # a vLLM that died while loading will never answer: stop waiting at once
    try:
        os.kill(int(open(pidfile).read().split()[0]), 0)
    except (OSError, ValueError, IndexError):  # no such process, or no readable pidfile
        return True
    return False

started = time.monotonic()
result = {"healthy": False, "completion": None, "error": None}
while True:
    try:
        with urllib.request.urlopen(url + "/health", timeout=3) as answer:
            result["healthy"] = answer.status == 200
    except (OSError, urllib.error.URLError) as error:
        result["error"] = f"/health: {error}"
    if result["healthy"]:
        break
    if pidfile and exited():
        result["error"] = f"vLLM exited while loading (pidfile {pidfile})"
        break
    if time.monotonic() - started >= budget:
        break
    time.sleep(2)
result["health_seconds"] = round(time.monotonic() - started, 1)
if result["healthy"]:
    body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}).encode()
    request = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        sent = time.monotonic()
        with urllib.request.urlopen(request, timeout=max(30.0, budget)) as answer:
            reply = json.load(answer)
        result["completion"] = reply["choices"][0]["text"]
        result["completion_seconds"] = round(time.monotonic() - sent, 3)
        result["error"] = None
    except (OSError, urllib.error.URLError, KeyError, ValueError) as error:
        result["error"] = f"/v1/completions: {error}"
print(json.dumps(result))
"""


def probe_command(url: str, model: str, budget_seconds: float, pidfile: str | None = None) -> StringCommand:
    args = ["python3", "-c", QuoteString(PROBE), QuoteString(url), QuoteString(model), str(budget_seconds)]
    if pidfile:
        args.append(QuoteString(pidfile))
    return StringCommand(*args)


class ServingProbe(FactBase):
    """One quick look at a vLLM endpoint from the host itself: healthy, and a completion."""

    def command(self, url, model):
        return probe_command(url, model, 0)

    def process(self, output):
        return json.loads("\n".join(output))


def _wait_until_ready(state, host, url, model, budget_seconds, endpoint, log_command, pidfile=None):
    status, output = host.run_shell_command(probe_command(url, model, budget_seconds, pidfile))
    result = json.loads(output.stdout) if status and output.stdout.strip() else {"error": output.stderr}
    if result.get("completion") is None:  # "" is a real answer, as ServingProbe counts it
        _, log = host.run_shell_command(log_command)
        raise OperationError(
            f"vLLM at {url} is not ready ({result.get('error')}; waited {result.get('health_seconds', '?')} "
            f"of {budget_seconds} s).\n"
            f"Last lines of its log:\n{log.stdout}"
        )
    logger.info(
        f"{host.print_prefix}vLLM healthy after {result['health_seconds']} s; serving {model} at {endpoint}; "
        f"completion in {result['completion_seconds']} s: {result['completion']!r}"
    )


@operation()
def serving(url: str, model: str, endpoint: str, budget_seconds: int, log_command: StringCommand,
            pidfile: str | None = None):
    """
    Wait until vLLM answers /health and a real completion, and say where it serves.

    + url: base URL as seen from the host itself (e.g. http://127.0.0.1:8000)
    + model: the served model name
    + endpoint: the OpenAI-compatible endpoint clients use, printed for the operator
    + budget_seconds: how long loading may take
    + log_command: prints the last lines of the service's log, shown when the wait fails
    + pidfile: the supervised process's pidfile; the wait ends early when that process exits
    """
    probe = host.get_fact(ServingProbe, url=url, model=model)
    if probe["healthy"] and probe["completion"] is not None:
        message = f"serving {model} at {endpoint}; completion: {probe['completion']!r}"
        if state.is_executing:
            logger.info(f"{host.print_prefix}{message}")
        host.noop(message)
        return
    yield FunctionCommand(_wait_until_ready, (url, model, budget_seconds, endpoint, log_command, pidfile), {})
