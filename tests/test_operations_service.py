"""operations/service.py: starting, restarting and reading vLLM's process under systemd or start-stop-daemon."""

import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from models.errors import HeavyliftConfigError
from operations import service
from operations.service import DaemonRunning, InitSystem, SystemdUnitState
from pyinfra_fixtures import run_operation, sh
from resolve.gpus import GpuInventory


def deployment(tp, gpus):
    return SimpleNamespace(name="kimi", tensor_parallel_size=tp, settings=SimpleNamespace(gpus=gpus))


def test_gpu_selection_matches_tensor_parallelism_and_the_host():
    assert service.gpu_selection(deployment(2, [4, 5]), GpuInventory()) == "4,5"
    assert service.gpu_selection(deployment(8, None), GpuInventory()) is None
    with pytest.raises(HeavyliftConfigError, match=r"field 'gpus' names 2 GPUs \(\[0, 1\]\) but tensor_parallel_size is 4"):
        service.gpu_selection(deployment(4, [0, 1]), GpuInventory())
    host = SimpleNamespace(count=8)
    with pytest.raises(HeavyliftConfigError, match="names GPU 9 but the host has 8 GPUs"):
        service.gpu_selection(deployment(2, [8, 9]), host)


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


def test_init_system_live(local_host):
    expected = "systemd" if os.path.isdir("/run/systemd/system") else "none"
    assert local_host.get_fact(InitSystem) == expected


def test_systemd_unit_state_live_unknown_unit(local_host):
    # no systemctl, no systemd, or no such unit: one blank or "inactive" line, never an error
    assert local_host.get_fact(SystemdUnitState, unit="heavylift-no-such-unit-4f1c.service") == {
        "active": False, "enabled": False, "need_reload": False,
    }


@pytest.mark.skipif(not shutil.which("start-stop-daemon"), reason="start-stop-daemon (dpkg) missing")
def test_daemon_running_live(local_host, odd_dir):
    pidfile = odd_dir / "vllm.pid"
    assert local_host.get_fact(DaemonRunning, pidfile=str(pidfile)) is False
    process = subprocess.Popen(["sleep", "30"])
    try:
        pidfile.write_text(f"{process.pid}\n")
        assert local_host.get_fact(DaemonRunning, pidfile=str(pidfile)) is True
    finally:
        process.kill()
        process.wait()
    assert local_host.get_fact(DaemonRunning, pidfile=str(pidfile)) is False


@pytest.mark.skipif(not shutil.which("start-stop-daemon"), reason="start-stop-daemon (dpkg) missing")
def test_daemon_running_live_counts_an_unreaped_process_as_dead(local_host, odd_dir):
    # vLLM that exited while its parent has not reaped it yet: signal 0 still reaches the zombie
    pidfile = odd_dir / "vllm.pid"
    process = subprocess.Popen(["true"])
    try:
        pidfile.write_text(f"{process.pid}\n")
        deadline = time.monotonic() + 10
        while "Z" not in Path(f"/proc/{process.pid}/stat").read_text().rpartition(")")[2].split()[0]:
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.05)
        os.kill(process.pid, 0)  # what start-stop-daemon --status asks: it answers
        assert local_host.get_fact(DaemonRunning, pidfile=str(pidfile)) is False
    finally:
        process.wait()


def test_running_release_live(local_host, odd_dir):
    """The release a process runs is the folder it was started in (its /proc/<pid>/cwd), read
    through a pidfile; a process elsewhere runs no release; a dead one is not running."""
    import subprocess

    from operations.service import RunningRelease

    releases = odd_dir / "releases"
    (releases / "abc123").mkdir(parents=True)
    pidfile = odd_dir / "run" / "serve.pid"
    pidfile.parent.mkdir()
    args = {"pid_source": f"pidfile:{pidfile}", "releases_dir": str(releases)}
    assert local_host.get_fact(RunningRelease, **args) is None  # no pidfile
    for cwd, release in ((releases / "abc123", "abc123"), (odd_dir, None)):
        process = subprocess.Popen(["sleep", "60"], cwd=cwd)
        try:
            pidfile.write_text(f"{process.pid}\n")
            assert local_host.get_fact(RunningRelease, **args) == {"pid": process.pid, "release": release}
        finally:
            process.kill()
            process.wait()
    assert local_host.get_fact(RunningRelease, **args) is None  # the pidfile names a dead process


def test_secrets_written_after_the_process_started_make_it_stale_live(local_host, odd_dir):
    """A run that wrote new secrets and was killed before its restart: the environment file is newer than the
    running process (its start time from /proc), so the next run restarts it; secrets it started with do not."""
    import subprocess

    from operations.service import RunningRelease

    releases = odd_dir / "releases"
    (releases / "abc123").mkdir(parents=True)
    pidfile = odd_dir / "run" / "serve.pid"
    pidfile.parent.mkdir()
    secrets = odd_dir / "private" / "serve.env"
    secrets.parent.mkdir()
    secrets.write_text("VLLM_API_KEY=old\n")
    os.utime(secrets, (time.time() - 120, time.time() - 120))  # written before the start
    args = {"pid_source": f"pidfile:{pidfile}", "releases_dir": str(releases), "secrets": str(secrets)}
    process = subprocess.Popen(["sleep", "60"], cwd=releases / "abc123")
    try:
        pidfile.write_text(f"{process.pid}\n")
        assert local_host.get_fact(RunningRelease, **args) == {"pid": process.pid, "release": "abc123",
                                                               "secrets_newer": False}
        secrets.write_text("VLLM_API_KEY=new\n")
        os.utime(secrets, (time.time() + 5, time.time() + 5))  # whole seconds: clearly after the start
        assert local_host.get_fact(RunningRelease, **args)["secrets_newer"] is True
        # a start right after the write, as its run makes it (whatever the fraction of a second the machine booted
        # at), never reads as "started before"
        for _ in range(5):
            secrets.write_text("VLLM_API_KEY=fresh\n")
            fresh = subprocess.Popen(["sleep", "60"], cwd=releases / "abc123")
            try:
                pidfile.write_text(f"{fresh.pid}\n")
                assert local_host.get_fact(RunningRelease, **args)["secrets_newer"] is False
            finally:
                fresh.kill()
                fresh.wait()
            time.sleep(0.23)
        pidfile.write_text(f"{process.pid}\n")
        # without the file named, the fact is what it was
        assert local_host.get_fact(RunningRelease, pid_source=args["pid_source"], releases_dir=str(releases)) == \
            {"pid": process.pid, "release": "abc123"}
    finally:
        process.kill()
        process.wait()


def test_secrets_newer_than_the_process_restart_it_with_the_reason():
    from operations import service

    lines = ["pid=42", "/opt/heavylift/deployments/kimi/releases/abc123", "started_ago=300.25", "secrets_ago=60",
             "releases=/opt/heavylift/deployments/kimi/releases"]
    assert service.RunningRelease().process(lines) == {"pid": 42, "release": "abc123", "secrets_newer": True}
    # written before the start, or within a second after it: by the run that started it
    for written, newer in (("301", False), ("300", False), ("299.5", False), ("299", True)):
        lines[3] = f"secrets_ago={written}"
        assert service.RunningRelease().process(lines)["secrets_newer"] is newer, written
    assert service.RunningRelease().process([*lines[:3], "releases=/x"]).get("secrets_newer") is None  # no file
