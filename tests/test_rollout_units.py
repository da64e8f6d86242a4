"""Rollout safety without hosts: the host lock's script on this machine.

Secrets, settings and GPU selection moved to the module files: test_resolve_secrets.py,
test_operations_secrets.py, test_models_schema.py, test_operations_service.py."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from operations import hostlock


# --- host lock ---------------------------------------------------------------------------------


def holder_process(lock: Path, label: str) -> subprocess.Popen:
    """A stand-in for a run's connection: a python process that takes the lock through sh, then stays."""
    command = hostlock.lock_command(str(lock), "take", label).get_raw_value()
    code = (
        "import subprocess, sys, time\n"
        f"done = subprocess.run(['sh', '-c', {command!r}], capture_output=True, text=True)\n"
        "print(done.returncode, done.stdout.strip(), flush=True)\n"
        "time.sleep(60)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def take(lock: Path, label="second run", mode="take"):
    command = hostlock.lock_command(str(lock), mode, label).get_raw_value()
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True)


def test_lock_names_its_holder_and_goes_stale_when_the_holder_dies(tmp_path):
    lock = tmp_path / "root dir" / "deploy.lock"
    first = holder_process(lock, "first run (pid 1234)")
    try:
        assert first.stdout.readline().startswith("0 taken by first run (pid 1234)")
        holder = json.loads((lock / "holder.json").read_text())
        assert holder["pid"] == first.pid
        started = time.monotonic()
        second = take(lock)
        assert second.returncode == hostlock.LOCKED
        assert second.stdout.startswith("locked by first run (pid 1234) since ")
        assert f"(host process {first.pid} python" in second.stdout
        assert time.monotonic() - started < 5
        # a dry run only looks
        seen = look(lock)
        assert seen["state"] == "held" and seen["holder"].startswith("first run (pid 1234)"), seen
    finally:
        first.kill()
        first.wait()
    seen = look(lock)
    assert seen["state"] == "stale" and seen["holder"].startswith("first run (pid 1234)"), seen
    third = take(lock, "third run")
    assert third.returncode == 0, third.stdout + third.stderr
    assert third.stdout.startswith("recovered a stale lock of first run (pid 1234)")
    assert json.loads((lock / "holder.json").read_text())["label"] == "third run"
    # the lock, and the count of its takes (first, third)
    assert sorted(p.name for p in lock.parent.iterdir()) == ["deploy.lock", "deploy.lock.generation"]
    assert json.loads((lock.parent / "deploy.lock.generation").read_text())["generation"] == 2


def test_only_the_holder_releases_the_lock(tmp_path):
    lock = tmp_path / "deploy.lock"
    first = holder_process(lock, "first run")
    try:
        assert first.stdout.readline().startswith("0 taken by first run")
        other = take(lock, mode="release")
        assert other.returncode == 0 and other.stdout.startswith("not ours: first run since "), other.stdout
        assert (lock / "holder.json").is_file()
    finally:
        first.kill()
        first.wait()
    # the holder's own connection gives it back (here: one sh that takes it, then releases it)
    both = " ; ".join(hostlock.lock_command(str(lock), mode, "second run").get_raw_value() for mode in ("take", "release"))
    result = subprocess.run(["sh", "-c", both], capture_output=True, text=True)
    assert result.stdout.splitlines()[0].startswith("recovered a stale lock of first run")
    assert result.stdout.splitlines()[-1].startswith("released: second run since "), result.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["deploy.lock.generation"]
    assert take(lock, mode="release").stdout == "free\n"


def look(lock: Path) -> dict:
    done = subprocess.run(["sh", "-c", hostlock.lock_command(str(lock), "look", "-").get_raw_value()],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_a_take_naming_an_older_generation_fails_and_leaves_no_lock(tmp_path):
    """A run reads the lock (free, generation g) and takes it at its first change, naming g: when another
    run took it in between, the take fails (76), takes nothing, and names the other run."""
    lock = tmp_path / "root" / "deploy.lock"
    assert look(lock) == {"state": "free", "holder": None, "generation": 0}  # a fresh host: no root yet
    read = look(lock)["generation"]
    # another run takes and gives back the lock in the meantime
    both = " ; ".join(hostlock.lock_command(str(lock), mode, "other run (pid 7)").get_raw_value()
                      for mode in ("take", "release"))
    subprocess.run(["sh", "-c", both], check=True, capture_output=True)
    assert look(lock) == {"state": "free", "holder": None, "generation": 1}

    late = subprocess.run(["sh", "-c", hostlock.lock_command(str(lock), "take", "late run", generation=read)
                           .get_raw_value()], capture_output=True, text=True)
    assert late.returncode == 76, late.stdout + late.stderr
    assert late.stdout.startswith("another run changed the host after this run read it: other run (pid 7) took the "
                                  "lock at "), late.stdout
    assert "(generation 1, this run read 0)" in late.stdout
    assert not lock.exists() and look(lock)["generation"] == 1
    # naming the generation it read now, a run takes it (and counts one more take)
    fresh = subprocess.run(["sh", "-c", hostlock.lock_command(str(lock), "take", "fresh run", generation=1)
                            .get_raw_value()], capture_output=True, text=True)
    assert fresh.returncode == 0 and fresh.stdout.startswith("taken by fresh run"), fresh.stdout
    # its holder is the process that ran sh (this test, as pyinfra for @local): alive
    assert look(lock)["state"] == "held" and look(lock)["generation"] == 2


def test_look_sees_a_held_lock_and_its_holder(tmp_path):
    lock = tmp_path / "deploy.lock"
    first = holder_process(lock, "first run (pid 1234)")
    try:
        assert first.stdout.readline().startswith("0 taken by first run (pid 1234)")
        seen = look(lock)
        assert seen["state"] == "held" and seen["holder"].startswith("first run (pid 1234) since "), seen
        assert seen["generation"] == 1
    finally:
        first.kill()
        first.wait()
    assert look(lock)["state"] == "stale"


def test_a_reused_pid_is_not_the_holder(tmp_path):
    lock = tmp_path / "deploy.lock"
    lock.mkdir()
    # our own pid, but a start time that is not ours: the holder that wrote this is gone
    (lock / "holder.json").write_text(json.dumps({"pid": os.getpid(), "start": "1", "comm": "sshd", "label": "old run"}))
    result = take(lock)
    assert result.returncode == 0 and result.stdout.startswith("recovered a stale lock of old run")


def test_of_two_racing_runs_exactly_one_takes_the_lock(tmp_path):
    lock = tmp_path / "deploy.lock"
    holders = [holder_process(lock, f"run {n}") for n in range(2)]
    try:
        firsts = sorted(h.stdout.readline().split()[0] for h in holders)
    finally:
        for h in holders:
            h.kill()
            h.wait()
    assert firsts == ["0", str(hostlock.LOCKED)]


def test_take_raises_naming_the_holder():
    class Host:
        name = "gpu1"

        def run_shell_command(self, command):
            from pyinfra.connectors.util import CommandOutput, OutputLine

            return False, CommandOutput([OutputLine("stdout", "locked by pyinfra run of ops@ctl (pid 42) since X")])

    with pytest.raises(hostlock.HostLocked, match=r"host 'gpu1': locked by pyinfra run of ops@ctl \(pid 42\)"):
        hostlock.take(Host(), "/opt/heavylift/deploy.lock")


def test_hold_refuses_a_held_lock_and_a_dry_run_only_says_so():
    class Host:
        name = "gpu1"
        print_prefix = "[gpu1] "

        def get_fact(self, cls, path):
            assert cls is hostlock.DeployLock
            return {"state": "held", "holder": "pyinfra run of ops@ctl (pid 42) since X", "generation": 3}

    with pytest.raises(hostlock.HostLocked, match=r"host 'gpu1': locked by pyinfra run of ops@ctl \(pid 42\)"):
        hostlock.hold(Host(), SimpleNamespace(), "/opt/heavylift/deploy.lock")
    assert hostlock.hold(Host(), SimpleNamespace(), "/opt/heavylift/deploy.lock", dry=True).startswith(
        "another run holds the lock: locked by pyinfra run of ops@ctl (pid 42)")
