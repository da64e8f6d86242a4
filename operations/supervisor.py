"""The supervisor of a deployment's vLLM, as the operator commands (rollback.py, retire.py) drive it:
systemd where the host runs it and the deployment has its unit, else the start-stop-daemon fallback.

deploy.py builds the same restart commands, log command and process source inline (section 6);
these use operations/service.py's own builders so both paths run the same commands.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.api.operation import OperationMeta

from . import service


@dataclass(frozen=True)
class Supervisor:
    manager: str  # "systemd" or "fallback"
    restart: tuple  # StringCommands: stop, then start without waiting (the readiness gate waits)
    stop: tuple  # StringCommands: stop and keep stopped (systemd: also disable)
    log_command: StringCommand  # the last 40 lines of the service's log
    pid_source: str  # for the readiness probe: "systemd:UNIT" or "pidfile:PATH"


def of(layout, manager: str, user: str, stop_grace: int) -> Supervisor:
    """The supervisor of ``layout``'s deployment; ``manager`` as the site says (auto, systemd, fallback)."""
    if manager == "auto":
        manager = "systemd" if host.get_fact(service.InitSystem) == "systemd" else "fallback"
    if manager == "systemd":
        unit = QuoteString(layout.unit_name)
        return Supervisor(
            manager="systemd",
            restart=tuple(service.systemd_restart(layout.unit_name)),
            stop=(StringCommand("systemctl", "disable", "--now", unit),
                  StringCommand("systemctl", "reset-failed", unit, "2>/dev/null", "||", "true")),
            log_command=StringCommand("journalctl", "-u", unit, "-n", "40", "--no-pager"),
            pid_source=f"systemd:{layout.unit_name}",
        )
    restart = service.daemon_restart(
        layout.service_launcher, layout.env_file, layout.pidfile, layout.logfile, stop_grace, user, layout.service_home,
    )
    return Supervisor(
        manager="fallback",
        restart=tuple(restart),
        stop=(restart[0],),
        log_command=StringCommand("tail", "-n", "40", QuoteString(layout.logfile)),
        pid_source=f"pidfile:{layout.pidfile}",
    )


@operation()
def restarted(commands: tuple, dependencies: list[OperationMeta], why: str = ""):
    """
    The service restarted when one of ``dependencies`` changed (a release switch), else left alone.

    + commands: the supervisor's restart commands
    + dependencies: operations whose change means the running process is stale
    + why: said when nothing changed
    """
    if service.changed_in_this_run(dependencies):
        yield from commands
    else:
        host.noop(why or "nothing the service depends on changed")
