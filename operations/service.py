"""Service: vLLM kept running under systemd, or under start-stop-daemon where a host has no systemd.

Both paths share the launcher script and environment file rendered from templates/,
and the same semantics: start when stopped, restart only when something the service
depends on changed in this run, otherwise leave the process alone.
"""

from __future__ import annotations

import posixpath
import shlex

from pyinfra import host, state
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.api.operation import OperationMeta


class InitSystem(FactBase):
    """'systemd' when systemd is the running service manager (sd_booted(3): /run/systemd/system), else 'none'."""

    def command(self):
        return "test -d /run/systemd/system && echo systemd || echo none"

    def process(self, output):
        return output[0].strip()


class SystemdUnitState(FactBase):
    """(active, enabled) of one unit, as systemctl reports them."""

    def command(self, unit):
        return StringCommand(
            "echo", "$(systemctl is-active", QuoteString(unit), "2>/dev/null)",
            "$(systemctl is-enabled", QuoteString(unit), "2>/dev/null)",
        )

    def process(self, output):
        words = (output[0].split() + ["", ""])[:2] if output else ["", ""]
        return {"active": words[0] in ("active", "activating", "reloading"), "enabled": words[1] == "enabled"}


class DaemonRunning(FactBase):
    """Whether the process in a start-stop-daemon pidfile is alive."""

    def command(self, pidfile):
        return StringCommand("start-stop-daemon", "--status", "--pidfile", QuoteString(pidfile), "&& echo yes || echo no")

    def process(self, output):
        return output[0].strip() == "yes"


def changed_in_this_run(dependencies: list[OperationMeta]) -> bool:
    """Did (or, while planning, will) any of these operations change the host?"""
    if state.is_executing:
        return any(meta.did_change() for meta in dependencies)
    return any(meta.will_change for meta in dependencies)


@operation()
def systemd_unit(unit: str, dependencies: list[OperationMeta], unit_file_op: OperationMeta | None = None):
    """
    A systemd unit enabled and running, restarted when a dependency changed.

    + unit: the unit name, e.g. heavylift-kimi.service
    + dependencies: operations whose change means the running process is stale
    + unit_file_op: the operation that writes the unit file (triggers daemon-reload)
    """
    if unit_file_op is not None and changed_in_this_run([unit_file_op]):
        yield "systemctl daemon-reload"
    status = host.get_fact(SystemdUnitState, unit=unit)
    if not status["enabled"]:
        yield StringCommand("systemctl", "enable", QuoteString(unit))
    if not status["active"]:
        yield StringCommand("systemctl", "start", QuoteString(unit))
    elif changed_in_this_run(dependencies):
        yield StringCommand("systemctl", "restart", QuoteString(unit))
    else:
        host.noop(f"{unit} is running and nothing it depends on changed")


def _start(launcher: str, env_file: str, pidfile: str, logfile: str):
    # sh execs the launcher, which execs vLLM: the pidfile names vLLM's own process
    inner = f". {shlex.quote(env_file)} && exec {shlex.quote(launcher)}"
    return StringCommand(
        "start-stop-daemon", "--start", "--background", "--make-pidfile",
        "--pidfile", QuoteString(pidfile), "--output", QuoteString(logfile),
        "--startas", "/bin/sh", "--", "-c", QuoteString(f"set -a && {inner}"),
    )


def _stop(pidfile: str, grace_seconds: int):
    # TERM lets vLLM drain and stop its engine processes; KILL only after the grace period
    return StringCommand(
        "start-stop-daemon", "--stop", "--oknodo", "--remove-pidfile", "--pidfile", QuoteString(pidfile),
        "--retry", f"TERM/{grace_seconds}/KILL/10",
    )


@operation()
def daemon(launcher: str, env_file: str, pidfile: str, logfile: str, dependencies: list[OperationMeta],
           running: bool = True, grace_seconds: int = 60):
    """
    The fallback for hosts without systemd: vLLM supervised by start-stop-daemon (dpkg).

    + launcher: the script that execs vLLM
    + env_file: environment for the launcher (exported with set -a)
    + pidfile: where the process id is kept
    + logfile: stdout and stderr of vLLM
    + dependencies: operations whose change means the running process is stale
    + running: whether the service should run
    + grace_seconds: how long a stop waits after SIGTERM before SIGKILL
    """
    is_running = host.get_fact(DaemonRunning, pidfile=pidfile)
    if not running:
        if is_running:
            yield _stop(pidfile, grace_seconds)
        else:
            host.noop(f"{launcher} is stopped")
        return
    if not is_running:
        yield StringCommand("mkdir", "-p", QuoteString(posixpath.dirname(pidfile)))
        yield _start(launcher, env_file, pidfile, logfile)
    elif changed_in_this_run(dependencies):
        yield _stop(pidfile, grace_seconds)
        yield _start(launcher, env_file, pidfile, logfile)
    else:
        host.noop(f"{launcher} is running (pidfile {pidfile}) and nothing it depends on changed")
