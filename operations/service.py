"""Service: vLLM kept running under systemd, or under start-stop-daemon where a host has no systemd.

Both paths share the launcher script and environment file rendered from templates/,
and the same semantics: start when stopped, restart when something the service depends on
changed in this run or when the running process was started from another release than
``current`` (a run that died between the switch and the restart), otherwise leave it alone.
"""

from __future__ import annotations

import json
import posixpath
import shlex

from pyinfra import host, logger, state
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import server

from . import hostpython, nodegroup


class PasswdEntry(FactBase):
    """One account's passwd entry (``getent passwd USER``): {"uid", "gid", "home", "shell"}, or None.

    pyinfra's ``server.user`` reads the ``Users`` fact, which runs lastlog and groups for every account
    of the host (0.56 s of a converged re-run here); a converged host needs only this one line."""

    def command(self, user):
        return StringCommand("getent", "passwd", QuoteString(user), "||", "true")

    def process(self, output):
        fields = output[0].strip().split(":") if output else []
        if len(fields) < 7:
            return None
        return {"uid": int(fields[2]), "gid": int(fields[3]), "home": fields[5], "shell": fields[6]}


@operation()
def service_user(user: str, home: str, shell: str = "/usr/sbin/nologin"):
    """
    The unprivileged system account vLLM (and a site source's server) runs as.

    + user: the account's name
    + home: its home folder (made by heavylift's own folder operation, not here)
    + shell: its login shell (none)

    An account that exists with this home and shell is left alone; otherwise pyinfra's ``server.user``
    creates or corrects it (a system account, no home made).
    """
    entry = host.get_fact(PasswdEntry, user=user)
    if entry is not None and entry["home"] == home and entry["shell"] == shell:
        host.noop(f"user {user} exists (uid {entry['uid']}, home {home}, shell {shell})")
        return
    yield from server.user._inner(user=user, system=True, home=home, shell=shell, ensure_home=False)


class InitSystem(FactBase):
    """'systemd' when systemd is the running service manager (sd_booted(3): /run/systemd/system), else 'none'."""

    def command(self):
        return "test -d /run/systemd/system && echo systemd || echo none"

    def process(self, output):
        return output[0].strip()


class SystemdUnitState(FactBase):
    """(active, enabled, need_reload) of one unit, as systemctl reports them.

    ``need_reload``: the unit's file or a drop-in changed on disk since systemd last read them
    (``NeedDaemonReload=yes``, systemctl show, systemd.unit(5)): edited by hand, or written by a run
    that died before its daemon-reload. systemd keeps starting the unit from what it read before.
    """

    def command(self, unit):
        return StringCommand(
            "echo", "$(systemctl is-active", QuoteString(unit), "2>/dev/null)",
            "$(systemctl is-enabled", QuoteString(unit), "2>/dev/null);",
            "systemctl", "show", "-p", "NeedDaemonReload", QuoteString(unit), "2>/dev/null", "||", "true",
        )

    def process(self, output):
        words = (output[0].split() + ["", ""])[:2] if output else ["", ""]
        return {
            "active": words[0] in ("active", "activating", "reloading"),
            "enabled": words[1] == "enabled",
            "need_reload": any(line.strip() == "NeedDaemonReload=yes" for line in output[1:]),
        }


class DaemonRunning(FactBase):
    """Whether the process in a start-stop-daemon pidfile is alive.

    ``start-stop-daemon --status`` answers yes for a zombie (signal 0 reaches it): vLLM that exited and
    whose parent has not reaped it yet. Such a process is dead, so its ``State:`` is read as well.
    """

    def command(self, pidfile):
        return StringCommand(
            "start-stop-daemon", "--status", "--pidfile", QuoteString(pidfile),
            "&& ! grep -qs '^State:[[:space:]]*[ZX]' \"/proc/$(head -n 1", QuoteString(pidfile), ')/status" && echo yes || echo no',
        )

    def process(self, output):
        return output[0].strip() == "yes"


# how much younger than the running process the secrets file must be to have been written after its start
SECRETS_MARGIN_SECONDS = 1.0


class RunningRelease(FactBase):
    """The release the running vLLM was started from: ``{"pid", "release"}``, or None when no process runs.

    The launcher runs vLLM from its release folder (templates/serve.sh.j2: ``cd "$HERE"``, then exec),
    so ``/proc/<pid>/cwd`` is ``<releases_dir>/<id>`` for the process's whole life; its argv and
    environment can be rewritten by the process (setproctitle), its cwd cannot from outside.
    ``release`` is None when the process runs from elsewhere (started by another launcher).
    The process is systemd's MainPID of the unit (``systemd:UNIT``) or the pidfile's (``pidfile:PATH``).

    With ``secrets`` (the service's environment file) also ``"secrets_newer"``: whether the file was written
    more than a second after the process started: a run that wrote new secrets and was killed before its restart.
    Both ages are read at one instant: the process's from ``/proc/uptime`` less its start in ``/proc/<pid>/stat``
    (field 22, clock ticks after boot; proc(5)), the file's from the clock less its mtime (whole seconds: never
    younger than it is). Start times from ``btime`` (whole seconds of /proc/stat) were off by up to a second, and
    a start that followed its run's write by less than that read as "started before" (CI, a stand-in group).
    """

    def command(self, pid_source, releases_dir, secrets=None):
        kind, _, value = pid_source.partition(":")
        if kind == "systemd":
            find = StringCommand("pid=$(systemctl show -p MainPID --value", QuoteString(value), "2>/dev/null)")
        else:
            find = StringCommand("pid=$(head -n 1", QuoteString(value), "2>/dev/null)")
        times = []
        if secrets:
            # field 22 is the 20th after the ") " that ends the command name (which may hold spaces)
            started = ("awk -v tck=\"$(getconf CLK_TCK)\" -v up=\"$(cut -d ' ' -f 1 /proc/uptime)\" "
                       "'{sub(/.*\\) /, \"\"); printf \"started_ago=%.2f\\n\", up - $20 / tck}' \"/proc/$pid/stat\" 2>/dev/null")
            written = StringCommand("m=$(stat -c %Y", QuoteString(secrets), '2>/dev/null) && echo "secrets_ago=$(($(date +%s) - m))"')
            times = [";", started, ";", written]
        return StringCommand(
            find, ";", 'case "$pid" in', "''|0|*[!0-9]*)", "echo", "none", ";;", "*)",
            "echo", '"pid=$pid"', ";", "readlink", '"/proc/$pid/cwd"', "||", "echo", "none", *times, ";;", "esac",
            ";", "echo", QuoteString(f"releases={releases_dir.rstrip('/')}"),
        )

    def process(self, output):
        lines = [line.strip() for line in output if line.strip()]
        releases = next((line.partition("=")[2] for line in lines if line.startswith("releases=")), "")
        pid = next((int(line[4:]) for line in lines if line.startswith("pid=") and line[4:].isdigit()), None)
        cwd = next((line for line in lines if line.startswith("/")), None)
        if pid is None or cwd is None:  # no process, or it is gone (no /proc/<pid>)
            return None
        folder, release = posixpath.split(cwd.rstrip("/"))
        found = {"pid": pid, "release": release if folder == releases and release else None}
        ages = {}
        for key, _, value in (line.partition("=") for line in lines):
            if key in ("started_ago", "secrets_ago"):
                try:
                    ages[key] = float(value)
                except ValueError:
                    pass
        if len(ages) == 2:
            # a second's margin: the run that starts vLLM writes its secrets before, never a second after
            found["secrets_newer"] = ages["secrets_ago"] < ages["started_ago"] - SECRETS_MARGIN_SECONDS
        return found


def stale_release(pid_source: str, releases_dir: str, release: str | None, secrets: str | None = None) -> str | None:
    """Why the running process must be restarted though nothing changed in this run: it was started
    from another release than ``release`` (a run that died after switching ``current``), or before its
    ``secrets`` file was last written (a run that died after writing them: the file is not part of the release,
    so nothing else would ever bring them into effect); else None."""
    if not release or not pid_source:
        return None
    running = host.get_fact(RunningRelease, pid_source=pid_source, releases_dir=releases_dir, secrets=secrets)
    if running is not None and running.get("secrets_newer"):
        return f"vLLM (pid {running['pid']}) started before {secrets} was last written"
    return _runs_another(running, release)


def _runs_another(running: dict | None, release: str) -> str | None:
    if running is None or running["release"] == release:
        return None
    started = f"release {running['release']}" if running["release"] else "outside heavylift's releases"
    return f"vLLM (pid {running['pid']}) runs {started}, not the current release {release}"


def group_node_read(group: tuple[str, ...], pid_source: str, releases_dir: str, release: str) -> None:
    """While the run is planned, on each node of a multi-node ``group``: why its vLLM must start though nothing
    changed (it is not running, or runs another release than ``release``), posted for every node's service
    operation, which restarts the group as one (operations/nodegroup.py). Planning, not the operation: with
    ``-y`` pyinfra runs an operation's body only when it executes, side by side on the nodes."""
    running = host.get_fact(RunningRelease, pid_source=pid_source, releases_dir=releases_dir)
    reason = "vLLM is not running" if running is None else _runs_another(running, release)
    nodegroup.post_start_reason(state, host, group, reason)


class DeploymentProcesses(FactBase):
    """The deployment's live processes (scripts/service_procs.py ``list``): ``{"main", "service", "leftovers"}``.

    A process belongs to the deployment when it runs as the service user from a folder under its releases
    (the launcher's ``cd``, inherited by every process vLLM starts); ``service`` is the supervisor's main
    process and its descendants, ``leftovers`` every other one (an earlier start's engine core and ranks).
    """

    def command(self, releases_dir, user, pid_source):
        return procs_command("list", releases_dir, user, pid_source)

    def process(self, output):
        return json.loads("\n".join(output))


PROCS_SCRIPT = "service_procs.py"


def procs_command(action: str, releases_dir: str, user: str, pid_source: str) -> StringCommand:
    """scripts/service_procs.py ACTION for one deployment, through ``python3 -c`` (nothing uploaded)."""
    return StringCommand(hostpython.PYTHON, "-c", QuoteString(hostpython.script(PROCS_SCRIPT)), action,
                         QuoteString(releases_dir), QuoteString(user), QuoteString(pid_source))


def processes_ended(releases_dir: str, user: str, pid_source: str) -> StringCommand:
    """Ends the deployment's processes outside its service (SIGTERM, then SIGKILL) and removes the /dev/shm
    segments its ranks left that no process holds (scripts/service_procs.py ``end``). After a stop, that is
    every process of the deployment: a rank or engine core that outlived its API server goes too."""
    return procs_command("end", releases_dir, user, pid_source)


def describe_processes(found: list[dict]) -> str:
    return ", ".join(f"pid {p['pid']} {p['name']} (release {p['release']})" for p in found)


@operation()
def leftovers_ended(releases_dir: str, user: str, pid_source: str):
    """
    No process of the deployment outside its service: an earlier start's engine core and ranks (still holding
    their memory, on GPU hosts their GPUs) are ended before the service starts or restarts, and the /dev/shm
    segments ranks left behind (held by no process) removed.

    + releases_dir: the deployment's releases folder (its processes run from a release in it)
    + user: the service user they run as
    + pid_source: the supervisor's main process ("systemd:UNIT" or "pidfile:PATH")
    """
    found = host.get_fact(DeploymentProcesses, releases_dir=releases_dir, user=user, pid_source=pid_source)
    if not found["leftovers"] and not found["stale_segments"]:
        host.noop(f"no process of {releases_dir} runs outside the service, no segment of its ranks is left")
        return
    if found["leftovers"]:
        logger.warning(f"{host.print_prefix}left from an earlier start, not part of the running service, "
                       f"ended before the start: {describe_processes(found['leftovers'])}")
    if found["stale_segments"]:
        size = sum(segment["bytes"] for segment in found["stale_segments"]) / (1 << 20)
        logger.info(f"{host.print_prefix}{len(found['stale_segments'])} /dev/shm segments of {user}'s earlier vLLM "
                    f"starts ({size:.0f} MiB) are held by no process: removed")
    yield processes_ended(releases_dir, user, pid_source)


def changed_in_this_run(dependencies: list[OperationMeta], group: tuple[str, ...] = ()) -> bool:
    """Did (or, while planning, will) any of these operations change the host, or, in a multi-node
    ``group``, any node of it, or must another node's vLLM start (operations/nodegroup.py: a group restarts
    whole)?"""
    if group:
        causes = nodegroup.restart_causes(state, host, dependencies, group)
        if causes and state.is_executing and host.name not in causes:
            logger.info(f"{host.print_prefix}restarted with its group: {nodegroup.describe_causes(causes)}")
        return bool(causes)
    if state.is_executing:
        return any(meta.did_change() for meta in dependencies)
    return any(meta.will_change for meta in dependencies)


class SystemdVersion(FactBase):
    """The running systemd's version number (``systemctl --version``: "systemd 252 (252.38-1~deb12u1)"), or 0."""

    def command(self):
        return "systemctl --version 2>/dev/null | head -n 1 || true"

    def process(self, output):
        words = output[0].split() if output else []
        return int(words[1]) if len(words) > 1 and words[0] == "systemd" and words[1].isdigit() else 0

    def default(self):
        return 0


# RestartSteps= and RestartMaxDelaySec= exist from systemd 254 (systemd.service(5), "Added in
# version 254"); Debian 12 ships 252, Ubuntu 24.04 255
RESTART_BACKOFF_SINCE = 254


def systemd_restart(unit: str, reap: list[StringCommand]) -> list[StringCommand]:
    """Stop (waits for vLLM to exit, so the gate can't reach the old process), end what it left (``reap``:
    ``processes_ended``), then start without waiting: the unit stays "activating" until /health answers
    (ExecStartPost), which can take an hour; the readiness gate does the waiting and reports."""
    return [
        StringCommand("systemctl", "stop", QuoteString(unit)),
        *reap,
        # a release that crashed StartLimitBurst times is refused until reset
        StringCommand("systemctl", "reset-failed", QuoteString(unit), "2>/dev/null", "||", "true"),
        StringCommand("systemctl", "start", "--no-block", QuoteString(unit)),
    ]


@operation()
def systemd_unit(unit: str, dependencies: list[OperationMeta], unit_file_op: OperationMeta | None = None,
                 release: str | None = None, releases_dir: str = "", group: tuple[str, ...] = (), user: str = "",
                 env_file: str | None = None):
    """
    A systemd unit enabled and running, restarted when a dependency changed or when it runs
    another release than ``release``.

    + unit: the unit name, e.g. heavylift-kimi.service
    + dependencies: operations whose change means the running process is stale
    + unit_file_op: the operation that writes the unit file (triggers daemon-reload)
    + release: the release id ``current`` names; the running process's is read (``RunningRelease``)
    + releases_dir: the folder of the release folders
    + group: the host names of its multi-node group: a change on any node restarts every node
    + user: the service user: what the old process left is ended after its stop (``processes_ended``)
    + env_file: the unit's EnvironmentFile: written after the process started, it restarts it
    """
    reap = [processes_ended(releases_dir, user, f"systemd:{unit}")] if user and releases_dir else []
    status = host.get_fact(SystemdUnitState, unit=unit)
    if unit_file_op is not None and changed_in_this_run([unit_file_op]):
        yield "systemctl daemon-reload"
    elif status.get("need_reload"):
        # changed on disk behind heavylift's back (a drop-in, a hand edit): without the reload a start or
        # restart below runs the unit as systemd read it before, and systemctl warns on every command
        logger.warning(f"{host.print_prefix}{unit} changed on disk since systemd read it (NeedDaemonReload=yes): "
                       "systemctl daemon-reload")
        yield "systemctl daemon-reload"
    if not status["enabled"]:
        yield StringCommand("systemctl", "enable", QuoteString(unit))
    if not status["active"]:
        nodegroup.group_changes(state, host, group)
        yield StringCommand("systemctl", "start", "--no-block", QuoteString(unit))
    elif changed_in_this_run(dependencies, group):
        nodegroup.group_changes(state, host, group)
        yield from systemd_restart(unit, reap)
    elif why := stale_release(f"systemd:{unit}", releases_dir, release, env_file):
        nodegroup.group_changes(state, host, group)
        logger.warning(f"{host.print_prefix}{why}: restarting {unit}")
        yield from systemd_restart(unit, reap)
    else:
        host.noop(f"{unit} is running{running_note(release)} and nothing it depends on changed")


def running_note(release: str | None) -> str:
    return f" release {release}" if release else ""


def _start(launcher: str, env_file: str, pidfile: str, logfile: str, user: str | None = None, home: str | None = None):
    # sh (root) reads the secrets, then execs setpriv, which drops to the service user and execs
    # the launcher, which execs vLLM: the pidfile names vLLM's own process. Only paths are in argv.
    inner = f". {shlex.quote(env_file)} && exec {shlex.quote(launcher)}"
    if user:
        drop = f"setpriv --reuid={shlex.quote(user)} --regid={shlex.quote(user)} --init-groups --"
        # setpriv changes the ids, not the environment: USER and LOGNAME would still say root, and Python's
        # getpass.getuser() reads them first. torch's Inductor keeps its cache in /tmp/torchinductor_<that name>
        # (torch 2.13 torch/_inductor/runtime/cache_dir_utils.py default_cache_dir), so vLLM's ranks (the CPU
        # build compiles there even in eager mode at TP > 1) died of "Permission denied: /tmp/torchinductor_root"
        # wherever root had run torch before. systemd's User= sets all three
        who = shlex.quote(user)
        inner = (f". {shlex.quote(env_file)} && set +a && HOME={shlex.quote(home or '/')} USER={who} LOGNAME={who} "
                 f"exec {drop} {shlex.quote(launcher)}")
    return StringCommand(
        "start-stop-daemon", "--start", "--background", "--make-pidfile",
        "--pidfile", QuoteString(pidfile), "--output", QuoteString(logfile),
        "--startas", "/bin/sh", "--", "-c", QuoteString(f"set -a && {inner}"),
    )


def daemon_stop(pidfile: str, grace_seconds: int):
    # TERM lets vLLM drain and stop its engine processes; KILL only after the grace period
    return StringCommand(
        "start-stop-daemon", "--stop", "--oknodo", "--remove-pidfile", "--pidfile", QuoteString(pidfile),
        "--retry", f"TERM/{grace_seconds}/KILL/10",
    )


def daemon_restart(launcher: str, env_file: str, pidfile: str, logfile: str, reap: list[StringCommand], grace_seconds: int = 60,
                   user: str | None = None, home: str | None = None) -> list[StringCommand]:
    """Stop (TERM, then KILL after the grace), end what the old process left (``reap``: ``processes_ended``),
    start."""
    return [
        daemon_stop(pidfile, grace_seconds),
        *reap,
        StringCommand("mkdir", "-p", QuoteString(posixpath.dirname(pidfile))),
        _start(launcher, env_file, pidfile, logfile, user, home),
    ]


@operation()
def daemon(launcher: str, env_file: str, pidfile: str, logfile: str, dependencies: list[OperationMeta],
           running: bool = True, grace_seconds: int = 60, user: str | None = None, home: str | None = None,
           release: str | None = None, releases_dir: str = "", group: tuple[str, ...] = ()):
    """
    The fallback for hosts without systemd: vLLM supervised by start-stop-daemon (dpkg).

    + launcher: the script that execs vLLM
    + env_file: secrets for the launcher (read by root, exported with set -a)
    + pidfile: where the process id is kept
    + logfile: stdout and stderr of vLLM
    + dependencies: operations whose change means the running process is stale
    + running: whether the service should run
    + grace_seconds: how long a stop waits after SIGTERM before SIGKILL
    + user: the service user vLLM runs as (setpriv); root when unset
    + home: HOME of the service user
    + release: the release id ``current`` names: a process started from another one is restarted
    + releases_dir: the folder of the release folders
    + group: the host names of its multi-node group: a change on any node restarts every node
    """
    is_running = host.get_fact(DaemonRunning, pidfile=pidfile)
    # start-stop-daemon stops only the API server: an engine core or rank that outlives it is ended after
    stopped = [daemon_stop(pidfile, grace_seconds)]
    if user and releases_dir:
        stopped.append(processes_ended(releases_dir, user, f"pidfile:{pidfile}"))
    if not running:
        if is_running:
            yield from stopped
        else:
            host.noop(f"{launcher} is stopped")
        return
    if not is_running:
        nodegroup.group_changes(state, host, group)
        yield StringCommand("mkdir", "-p", QuoteString(posixpath.dirname(pidfile)))
        # a pidfile left by a process that exited (or is a zombie not yet reaped) makes
        # start-stop-daemon --start answer "process already running" and start nothing
        yield StringCommand("rm", "-f", QuoteString(pidfile))
        yield _start(launcher, env_file, pidfile, logfile, user, home)
    elif changed_in_this_run(dependencies, group):
        nodegroup.group_changes(state, host, group)
        yield from stopped
        yield _start(launcher, env_file, pidfile, logfile, user, home)
    elif why := stale_release(f"pidfile:{pidfile}", releases_dir, release, env_file):
        nodegroup.group_changes(state, host, group)
        logger.warning(f"{host.print_prefix}{why}: restarting it")
        yield from stopped
        yield _start(launcher, env_file, pidfile, logfile, user, home)
    else:
        host.noop(f"{launcher} is running{running_note(release)} (pidfile {pidfile}) and nothing it depends on changed")


def gpu_selection(deployment, gpus, where: str = "") -> str | None:
    """CUDA_VISIBLE_DEVICES for the site's ``gpus``, checked against tensor parallelism and the host.

    Two deployments share a host on disjoint GPUs by naming them; vLLM then sees only those,
    renumbered from 0 (CUDA_VISIBLE_DEVICES, CUDA C Programming Guide, "CUDA Environment Variables").
    """
    from models.errors import HeavyliftConfigError

    chosen = deployment.settings.gpus
    if chosen is None:
        return None
    tp = deployment.tensor_parallel_size
    if len(chosen) != tp:
        raise HeavyliftConfigError(
            f"{where or deployment.name}: field 'gpus' names {len(chosen)} GPUs ({chosen}) but tensor_parallel_size is {tp}. "
            f"Fix: name exactly {tp} GPUs, or set tensor_parallel_size to {len(chosen)}. No host was changed."
        )
    count = gpus.count if gpus is not None else 0
    # a host without nvidia-smi (the CPU demo) has no GPUs to check against
    if count and max(chosen) >= count:
        raise HeavyliftConfigError(
            f"{where or deployment.name}: field 'gpus' names GPU {max(chosen)} but the host has {count} GPUs "
            f"(0-{count - 1}). Fix: name GPUs the host has. No host was changed."
        )
    return ",".join(str(index) for index in chosen)
