"""The supervisor of a deployment's vLLM: systemd's unit or the start-stop-daemon fallback, as planning decided
(resolve/supervisor.py).

One place owns unit-or-daemon, the restart and stop commands, the log command and the pid source, for
deploy.py (operations/rollout.py ``service_running``) and the operator commands (rollback.py, retire.py)
alike; the commands themselves are operations/service.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from pathlib import Path

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files

from resolve.supervisor import SYSTEMD, asks_host

from . import service

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


@dataclass(frozen=True)
class Supervisor:
    manager: str  # "systemd" or "fallback"
    restart: tuple  # StringCommands: stop, then start without waiting (the readiness gate waits)
    stop: tuple  # StringCommands: stop and keep stopped (systemd: also disable)
    log_command: StringCommand  # the last 40 lines of the service's log
    pid_source: str  # for the readiness probe: "systemd:UNIT" or "pidfile:PATH"
    log_source: str = ""  # for the readiness probe's start-up breakdown: "journal:UNIT" or "file:PATH"
    # retire.py: stopped for good before the deployment's files go (a unit already gone is no failure), what
    # its processes left, and systemd's own record of the unit cleared once its file is removed
    retire_stop: tuple = ()
    reap: StringCommand | None = None
    after_removal: tuple = ()

    def converged(self, plan, dependencies: list[OperationMeta]) -> OperationMeta:
        """The service of ``plan`` (resolve/plan.py) running its current release, restarted only when one of
        ``dependencies`` changed (or it runs another release than current)."""
        layout, part = plan.layout, plan.service
        if plan.group:
            # a node whose vLLM died or runs another release restarts its whole group (operations/nodegroup.py)
            service.group_node_read(plan.group, self.pid_source, layout.releases, plan.release.id)
        # an earlier start's engine core and ranks that outlived their API server: ended before this start
        service.leftovers_ended(name="vLLM processes outside the service", releases_dir=layout.releases, user=part.user,
                                pid_source=self.pid_source)
        if self.manager == SYSTEMD:
            unit_file = files.template(
                name="systemd unit",
                src=str(TEMPLATES / "vllm.service.j2"),
                dest=layout.unit_path,
                deployment=plan.deployment,
                repo=plan.weights.snapshot.repo,
                commit=plan.weights.snapshot.commit,
                service_user=part.user,
                env_file=layout.env_file,
                launcher=layout.service_launcher,
                probe_script=layout.probe_script,
                health_url=plan.gate.url,
                timeout_start=part.start_timeout,
                timeout_stop=part.stop_grace,
                restart_sec=part.restart_delay,
                restart_backoff=host.get_fact(service.SystemdVersion) >= service.RESTART_BACKOFF_SINCE,
                restart_max_delay=part.restart_max_delay,
                limit_nofile=part.limit_nofile,
            )
            return service.systemd_unit(
                name=f"service {layout.unit_name}", unit=layout.unit_name,
                dependencies=[*dependencies, unit_file], unit_file_op=unit_file,
                release=plan.release.id, releases_dir=layout.releases, group=plan.group, user=part.user,
                env_file=layout.env_file,
            )
        return service.daemon(
            name="service (start-stop-daemon)", launcher=layout.service_launcher, env_file=layout.env_file,
            pidfile=layout.pidfile, logfile=layout.logfile, dependencies=dependencies,
            grace_seconds=part.stop_grace, user=part.user, home=layout.service_home,
            release=plan.release.id, releases_dir=layout.releases, group=plan.group,
        )


def init_system(setting: str) -> str | None:
    """What planning decides service_manager "auto" by (resolve/supervisor.py): the host's running service manager
    (``InitSystem``); None, not read, where the site names the supervisor."""
    return host.get_fact(service.InitSystem) if asks_host(setting) else None


def of(layout, manager: str, user: str, stop_grace: int) -> Supervisor:
    """The supervisor of ``layout``'s deployment; ``manager`` as planning decided it (systemd or fallback,
    resolve/supervisor.py), or as the host's state says it runs (retire.py)."""
    if manager == SYSTEMD:
        unit = QuoteString(layout.unit_name)
        # what a stop leaves (a rank's /dev/shm segments; on a crash, ranks outside the unit's cgroup: none) goes after it
        reap = [service.processes_ended(layout.releases, user, f"systemd:{layout.unit_name}")]
        return Supervisor(
            manager=SYSTEMD,
            restart=tuple(service.systemd_restart(layout.unit_name, reap)),
            stop=(StringCommand("systemctl", "disable", "--now", unit),
                  StringCommand("systemctl", "reset-failed", unit, "2>/dev/null", "||", "true"), *reap),
            log_command=StringCommand("journalctl", "-u", unit, "-n", "40", "--no-pager"),
            pid_source=f"systemd:{layout.unit_name}",
            log_source=f"journal:{layout.unit_name}",
            retire_stop=(StringCommand("systemctl", "disable", "--now", unit, "2>/dev/null", "||", "true"),),
            reap=reap[0],
            after_removal=(StringCommand("systemctl", "daemon-reload", "2>/dev/null", "||", "true"),
                           StringCommand("systemctl", "reset-failed", unit, "2>/dev/null", "||", "true")),
        )
    # start-stop-daemon stops the API server alone: an engine core or rank that outlives it goes after it
    reap = [service.processes_ended(layout.releases, user, f"pidfile:{layout.pidfile}")]
    restart = service.daemon_restart(
        layout.service_launcher, layout.env_file, layout.pidfile, layout.logfile, reap, stop_grace, user,
        layout.service_home,
    )
    return Supervisor(
        manager="fallback",
        restart=tuple(restart),
        stop=(restart[0], *reap),
        log_command=StringCommand("tail", "-n", "40", QuoteString(layout.logfile)),
        pid_source=f"pidfile:{layout.pidfile}",
        log_source=f"file:{layout.logfile}",
        retire_stop=(restart[0],),
        reap=reap[0],
    )


def site_source_stop(paths, manager: str) -> tuple:
    """The site source's server (``paths``: resolve/layout.py ``SiteSourceLayout``) stopped for good, under the
    supervisor the host's state says it runs under: retire.py, with the host's last deployment. systemd forgets its
    unit after the unit file goes (``after_removal`` of the deployment's own supervisor reloads)."""
    if manager == SYSTEMD:
        unit = QuoteString(paths.unit_name)
        return (StringCommand("systemctl", "disable", "--now", unit, "2>/dev/null", "||", "true"),
                StringCommand("systemctl", "reset-failed", unit, "2>/dev/null", "||", "true"))
    return (service.daemon_stop(paths.pidfile, 10),)


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
