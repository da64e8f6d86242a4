"""Rollout safety without hosts: the host lock's script on this machine, secrets sources, settings, GPUs."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from models.errors import HeavyliftConfigError
from models.schema import SiteSettings
from operations import hostlock, release, secrets, service
from resolve.gpus import GpuInventory

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


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


# --- secrets ------------------------------------------------------------------------------------


def settings(**data):
    return SiteSettings.model_validate({"model": "tiny-llama", "vllm": {"version": "0.34.0"}, **data})


def test_secrets_come_from_the_environment_or_a_file(tmp_path, monkeypatch):
    key_file = tmp_path / "api key"
    key_file.write_text("sk-from-file\n")
    key_file.chmod(0o600)
    monkeypatch.setenv("MY_HF_TOKEN", "hf_from_env")
    found = secrets.resolve(settings(hf_token="env:MY_HF_TOKEN", api_key=f"file:{key_file}"))
    assert {k: v.get_secret_value() for k, v in found.items()} == {"HF_TOKEN": "hf_from_env", "VLLM_API_KEY": "sk-from-file"}
    assert "hf_from_env" not in repr(found)
    text = secrets.render_env_file(str(TEMPLATES / "serve.env.j2"), "demo", found)
    script = "set -a; . /dev/stdin; printf '%s|%s' \"$HF_TOKEN\" \"$VLLM_API_KEY\""
    assert subprocess.run(["sh", "-c", script], input=text, capture_output=True, text=True).stdout == "hf_from_env|sk-from-file"


def test_missing_secret_names_field_and_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    with pytest.raises(secrets.SecretSourceError, match=r"field 'api_key': the environment variable NOT_SET_ANYWHERE is not set"):
        secrets.resolve(settings(api_key="env:NOT_SET_ANYWHERE"))
    with pytest.raises(secrets.SecretSourceError, match=r"field 'hf_token': cannot read .*nope"):
        secrets.resolve(settings(hf_token=f"file:{tmp_path}/nope"))


@pytest.mark.parametrize("field", ["hf_token", "api_key"])
def test_a_plain_secret_in_the_inventory_is_refused_without_repeating_it(field):
    with pytest.raises(ValidationError) as raised:
        settings(**{field: "hf_AbCdEfGhIjKlMnOp"})
    assert "never goes into the inventory" in str(raised.value)


def test_api_key_flag_is_refused_in_extra_args():
    with pytest.raises(ValidationError, match="api_key"):
        settings(extra_args=["--api-key", "sk-x"])


def test_env_file_op_is_never_a_diff_and_never_argv():
    from pyinfra_fixtures import run_operation

    commands, _ = run_operation(secrets.env_file, {"path": "/p/serve.env", "content": "VLLM_API_KEY=sk-secret\n"},
                                {"files.Sha256File": {"path=/p/serve.env": None}})
    assert len(commands) == 1 and "sk-secret" not in json.dumps(commands)


# --- settings: service user, GPUs ------------------------------------------------------------------


def test_service_user_is_not_root():
    with pytest.raises(ValidationError, match="other than root"):
        settings(service_user="root")


@pytest.mark.parametrize("gpus, message", [([], "empty list"), ([0, 0], "names a GPU twice"), ([-1], "0 or more")])
def test_bad_gpu_lists(gpus, message):
    with pytest.raises(ValidationError, match=message):
        settings(gpus=gpus)


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


def test_release_id_changes_with_each_part():
    base = release.release_id("/v/a", "launcher", {"content": "c"})
    assert base == release.release_id("/v/a", "launcher", {"content": "c"})
    assert len({base, release.release_id("/v/b", "launcher", {"content": "c"}),
                release.release_id("/v/a", "launcher2", {"content": "c"}),
                release.release_id("/v/a", "launcher", {"content": "d"})}) == 4
