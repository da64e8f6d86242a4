"""End to end, a fleet rolled out in waves: three SSH test hosts serving the tiny model with real vLLM
(CPU build, the start-stop-daemon fallback), ``wave_size = 1``.

One bed for the module: a first run converges the three at once (no waves yet: three vLLM starts
side by side), then an upgrade in waves whose second wave fails its gate (host2's release carries a
flag vLLM rejects at start, so it fails in seconds): host1 (wave 1) serves the new release, host2 is
rolled back to its old one and serves it, host3 (wave 3) is held: its ``current`` link and its vLLM
process are the ones from before the run, though the new release was prepared there too. The run
exits non-zero and names which host runs what.
"""

import json
import os
import re
import time
import urllib.request

import pytest

import rollout_support
from rollout_support import read_pid, current_release
from conftest import TEST_ROOT, one_core_each, run_pyinfra, tiny_site_data
from testbed.ssh_hosts import find_free_port

pytestmark = pytest.mark.e2e

NAMES = ("host1", "host2", "host3")
# the test hosts share this machine's network: each host's vLLM gets a port of its own
PORTS: dict[str, int] = {}
for _name in NAMES:
    while (port := find_free_port()) in PORTS.values():
        pass
    PORTS[_name] = port
# a core of its own for host1's engine, whose drain under traffic is measured below; host2 and host3 share the
# other (on core 0 together, a host starting under client traffic waited minutes for it)
CORE_OF = {**one_core_each(NAMES), "host3": one_core_each(NAMES)["host2"]}
DEPLOYMENT_DIR = f"{TEST_ROOT}/deployments/tiny-llama"
# a good change for the whole fleet (a new release everywhere), and one vLLM refuses at start for host2
GOOD = ["--max-num-seqs", "4"]
# vLLM's drain on SIGTERM (--shutdown-timeout): the requests in flight when a restart begins finish in it. A drain
# ends when the last request does, so a long bound costs nothing when the host keeps up; past it vLLM 0.32 kills
# its engine and leaves the streams open until the supervisor's SIGKILL (docs/fleet.md)
SHUTDOWN_TIMEOUT = 60
BAD = [*GOOD, "--no-such-vllm-flag"]


def complete(port):
    body = json.dumps({"model": "heavylift/tiny-llama", "prompt": "Hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.load(answer)




def running_release(host):
    return os.readlink(f"/proc/{read_pid(host)}/cwd").rsplit("/", 1)[-1]


@pytest.fixture(scope="module")
def fleet(testbed_factory, hub_mirror, warm_uv_cache, venv_seed, tmp_path_factory):
    started = time.monotonic()
    bed = testbed_factory(list(NAMES), seeds=venv_seed)
    inventory = tmp_path_factory.mktemp("waves") / "site.py"

    def write(extra_args=None, **site):
        extra_args = extra_args or {}
        bed.write_inventory(inventory, host_data={
            name: tiny_site_data(hub_mirror.url, warm_uv_cache, port=PORTS[name], readiness_timeout=900,
                                 service_manager="fallback", shutdown_timeout=SHUTDOWN_TIMEOUT, benchmark_tokens=0,
                                 extra_args=extra_args.get(name, []), env=CORE_OF[name], **site)
            for name in NAMES
        })

    write()
    first = run_pyinfra(inventory)
    assert first.returncode == 0, first.output[-5000:]
    first_seconds = time.monotonic() - started
    before = {name: {"release": current_release(bed[name]), "pid": read_pid(bed[name]),
                     "link": bed[name].view(f"{DEPLOYMENT_DIR}/current").lstat().st_mtime_ns} for name in NAMES}

    write(extra_args={"host1": GOOD, "host2": BAD, "host3": GOOD}, wave_size=1)
    rollout_started = time.monotonic()
    rollout = run_pyinfra(inventory)
    rollout_seconds = time.monotonic() - rollout_started
    print(f"\nfirst converge of 3 hosts {first_seconds:.0f} s; rollout in waves {rollout_seconds:.0f} s")
    return {"bed": bed, "inventory": inventory, "before": before, "rollout": rollout, "write": write}


def test_the_failed_wave_is_rolled_back_and_the_run_fails(fleet):
    rollout, bed, before = fleet["rollout"], fleet["bed"], fleet["before"]
    output = rollout.output
    assert rollout.returncode != 0, output[-5000:]
    assert "--> Rolling out in 3 waves (tiny-llama: 1 at a time): 1: host1; 2: host2; 3: host3" in output, output[-5000:]
    host2 = bed["host2"]
    old = before["host2"]["release"]
    assert "[host2] release" in output and f"was rolled back: release {old} serves heavylift/tiny-llama" in output, \
        output[-5000:]
    assert "no-such-vllm-flag" in output
    assert current_release(host2) == running_release(host2) == old
    assert read_pid(host2) != before["host2"]["pid"]  # restarted twice: the bad release, then its old one again
    assert complete(PORTS["host2"])["choices"][0]["text"] is not None


def test_the_wave_before_serves_the_new_release(fleet):
    bed, before = fleet["bed"], fleet["before"]
    host1 = bed["host1"]
    new = current_release(host1)
    assert new != before["host1"]["release"] and running_release(host1) == new
    assert "--max-num-seqs" in open(f"/proc/{read_pid(host1)}/cmdline", "rb").read().decode(errors="replace")
    assert complete(PORTS["host1"])["choices"][0]["text"] is not None
    status = json.loads(host1.run(f"cat {DEPLOYMENT_DIR}/status.json").stdout)
    assert status["release"] == new and status["healthy"]


def test_the_waves_after_it_keep_serving_untouched(fleet):
    bed, before, output = fleet["bed"], fleet["before"], fleet["rollout"].output
    host3 = bed["host3"]
    assert ("[host3] held: the rollout stopped before wave 3 of 3 (host3): host2: 'vLLM ready' failed; "
            "it keeps serving what it serves, untouched") in output, output[-5000:]
    # the same process on the same release, the link not even rewritten
    assert read_pid(host3) == before["host3"]["pid"]
    assert current_release(host3) == running_release(host3) == before["host3"]["release"]
    assert host3.view(f"{DEPLOYMENT_DIR}/current").lstat().st_mtime_ns == before["host3"]["link"]
    assert complete(PORTS["host3"])["choices"][0]["text"] is not None
    # what does not touch the service ran there too: the new release is built, waiting for the next run
    releases = host3.run(f"ls {DEPLOYMENT_DIR}/releases").stdout.split()
    assert len(releases) == 2 and before["host3"]["release"] in releases


def test_the_run_says_which_hosts_run_what(fleet):
    bed, before, output = fleet["bed"], fleet["before"], fleet["rollout"].output
    new = current_release(bed["host1"])
    assert "--> Rollout stopped in wave 2 of 3: host2: 'vLLM ready' failed; waves 3-3 were held" in output, output[-5000:]
    for line in (
        rf"wave 1: host1: runs release {new} \(pid {read_pid(bed['host1'])}\): rolled out",
        rf"wave 2: host2: runs release {before['host2']['release']} \(pid {read_pid(bed['host2'])}\): failed \('vLLM ready' failed\)",
        rf"wave 3: host3: runs release {before['host3']['release']} \(pid {before['host3']['pid']}\): held, untouched",
    ):
        assert re.search(line, output), f"{line}\n{output[-4000:]}"
    # status.py reads the same from the hosts
    shown = rollout_support.status(fleet["inventory"])
    releases = {name: shown.document["hosts"][name]["deployments"]["tiny-llama"]["release"] for name in NAMES}
    assert releases == {"host1": new, "host2": before["host2"]["release"], "host3": before["host3"]["release"]}


# --- the fleet under fire (one bed: the hosts above, every host serving again after the failed wave) ---

# each rollout below changes one flag on every host: a new release everywhere, one restart per host
UNDER_TRAFFIC = ["--max-num-seqs", "3"]
AFTER_FAULTS = ["--max-num-seqs", "2"]
# the clients: STREAMS at once, each a streamed completion of TOKENS tokens after another, PAUSE seconds
# apart, round robin over the hosts (bounded: two cores serve three hosts and start one of them meanwhile)
STREAMS, TOKENS, PAUSE = 2, 16, 0.5
# and long ones to host1 from wave 1's switch there until its stop: BURST in flight when the stop begins
BURST, BURST_TOKENS = 3, 200
SHUTDOWN_LINE = "[shutdown] API server: shutdown triggered"  # vLLM 0.32 (entrypoints/launchers/launcher.py)
# and when the drain ran past --shutdown-timeout: the engine is killed with requests unfinished (v1/utils.py shutdown)
DRAIN_TIMED_OUT = "[shutdown] Process manager: force killing remaining process"


def pids(bed):
    return {name: read_pid(bed[name]) for name in NAMES}


def serves_with(bed, name, args) -> bool:
    cmdline = open(f"/proc/{read_pid(bed[name])}/cmdline", "rb").read().decode(errors="replace").split("\0")
    return current_release(bed[name]) == running_release(bed[name]) and \
        any(cmdline[i:i + len(args)] == args for i in range(len(cmdline)))


def test_a_rolling_upgrade_under_traffic_keeps_max_unavailable_and_breaks_no_stream(fleet):
    """max_unavailable 1 while clients stream from every host: never two hosts out at once (``/health``
    sampled every 100 ms), every refusal comes from a host that is out, no answer that began is broken off,
    and requests in flight when their host began to drain complete (vLLM's --shutdown-timeout)."""
    from testbed.traffic import Traffic

    import subprocess
    import threading

    from conftest import PYINFRA, REPO_ROOT, PyinfraRun

    bed = fleet["bed"]
    before = pids(bed)
    fleet["write"](extra_args={name: UNDER_TRAFFIC for name in NAMES}, max_unavailable=1)
    endpoints = {name: f"http://127.0.0.1:{PORTS[name]}" for name in NAMES}
    host1 = bed["host1"]
    link, old_release = host1.view(f"{DEPLOYMENT_DIR}/current"), current_release(host1)
    vllm_log = host1.view(f"{DEPLOYMENT_DIR}/run/serve.log")
    log_offset = vllm_log.stat().st_size  # vLLM's lines from here on: read only those, every 10 ms

    def drain_logged() -> bool:
        with open(vllm_log, "rb") as log:
            log.seek(log_offset)
            return SHUTDOWN_LINE.encode() in log.read()

    burst, drain_began = [], []
    log_file = fleet["inventory"].parent / "rollout-under-traffic.log"

    def send_until_host1_drains(run) -> float:
        """Wave 1 switches host1's `current`, then stops its vLLM: long requests sent from the switch on are in
        flight when the stop begins, and vLLM says when its drain begins. Returns that moment."""
        rollout_support.wait_until(lambda: os.readlink(link).rsplit("/", 1)[-1] != old_release or run.poll() is not None,
                                   timeout=900, what="wave 1's switch on host1", step=0.01)
        stopping = threading.Event()

        def send_until_the_stop():  # one long request after another: one is always in flight
            while not stopping.is_set():
                burst.append(load.complete("host1", max_tokens=BURST_TOKENS))

        senders = [threading.Thread(target=send_until_the_stop) for _ in range(BURST)]
        for sender in senders:
            sender.start()
        try:
            rollout_support.wait_until(lambda: drain_logged() or run.poll() is not None,
                                       timeout=900, what="host1's vLLM stop", step=0.01)
            return time.monotonic()
        finally:
            stopping.set()
            for sender in senders:
                sender.join(300)

    with Traffic(endpoints, model="heavylift/tiny-llama", streams=STREAMS, max_tokens=TOKENS, pause=PAUSE) as load:
        time.sleep(5)  # every host answers before the rollout begins
        started = time.monotonic()
        with open(log_file, "w") as log:
            run = subprocess.Popen([PYINFRA, "-y", str(fleet["inventory"]), "deploy.py"], cwd=REPO_ROOT,
                                   stdout=log, stderr=subprocess.STDOUT)
            try:
                drain_began.append(send_until_host1_drains(run))
                run.wait(timeout=1500)
            finally:  # a run that outlives the test would hold the hosts' locks for the tests after it
                if run.poll() is None:
                    run.kill()
                    run.wait()
                    print(f"\nthe rollout under traffic did not end; its last lines:\n{log_file.read_text()[-3000:]}")
        rollout = PyinfraRun(run.returncode, log_file.read_text())
        rollout_seconds = time.monotonic() - started
        time.sleep(5)  # and after it ends
    report = load.report()
    drained = [r for r in burst if r.started < drain_began[0] < r.ended]
    print(f"\nrolling upgrade of 3 hosts under {STREAMS} streams: {rollout_seconds:.0f} s; {report.describe()}")
    for outage in report.outages:
        print(f"    {outage.host} out {outage.seconds:.1f} s")
    print(f"    {len(burst)} requests of {BURST_TOKENS} tokens sent to host1 from its switch to its stop: "
          f"{sum(r.outcome == 'ok' for r in burst)} ok, {len(drained)} in flight when its vLLM began to drain, "
          f"drained in {max((r.ended - drain_began[0] for r in drained), default=0):.1f} s")

    assert rollout.returncode == 0, rollout.output[-5000:]
    assert "--> Rolling out in 3 waves (tiny-llama: 1 at a time): 1: host1; 2: host2; 3: host3" in rollout.output
    after = pids(bed)
    for name in NAMES:
        assert after[name] != before[name] and serves_with(bed, name, UNDER_TRAFFIC), name
    # each host was out once (its restart), never two at once
    assert sorted(o.host for o in report.outages) == sorted(NAMES), report.outages
    assert report.max_out_at_once == 1, report.outages
    # what the clients saw
    assert report.of("broken") == [], report.of("broken")
    assert report.refused_outside_outages(slack=SHUTDOWN_TIMEOUT + 5) == [], report.of("refused")
    for name in NAMES:
        back = max(o.ended for o in report.outages if o.host == name)
        assert any(r.host == name and r.started > back for r in report.of("ok")), f"{name} served no request after its restart"
    assert len(report.of("ok")) > 3 * len(NAMES)
    fleet["traffic"] = report
    # graceful drain: host1 answers in full what it had taken when its stop began (a request sent in the
    # instant between the signal and this test seeing vLLM's line may be refused: it was never taken)
    assert burst and all(r.ended - drain_began[0] < SHUTDOWN_TIMEOUT + 40 for r in burst), burst  # none hangs
    cut = [r for r in burst if r.outcome == "broken" or (r.started < drain_began[0] - 1 and r.tokens != BURST_TOKENS)]
    with open(vllm_log, "rb") as log:
        log.seek(log_offset)
        drain_lines = [line for line in log.read().decode(errors="replace").splitlines() if "[shutdown]" in line]
    said = "\n".join(drain_lines[:20])
    if cut and any(DRAIN_TIMED_OUT in line for line in drain_lines):
        # vLLM's own bound, not a lost request of heavylift's: the engine could not finish them within
        # --shutdown-timeout (this 2-core machine starving host1's engine), so vLLM killed it and the streams
        # waited for the stop's SIGKILL. Reported with vLLM's lines, never counted as a pass
        pytest.xfail(f"host1's drain ran past --shutdown-timeout {SHUTDOWN_TIMEOUT} s and vLLM killed its engine: "
                     f"{len(cut)} stream(s) cut ({', '.join(f'{r.tokens} tokens' for r in cut)})\n{said}")
    # a stream cut while vLLM drained within its bound would be a request lost by the rollout
    assert not cut, f"{cut}\n{said}"
    assert drained, (drain_began, burst)


def test_a_host_cut_off_mid_wave_holds_the_waves_after_it_and_the_next_run_converges(fleet):
    """host2's sshd and SSH sessions die while wave 1 (host1) restarts: the rollout stops at host2, host3 is
    held untouched, host2 and host3 keep serving what they served; host1 serves the new release."""
    import subprocess

    from conftest import PYINFRA, REPO_ROOT
    from testbed.ssh_hosts import process_is_gone

    bed = fleet["bed"]
    before = {name: (current_release(bed[name]), read_pid(bed[name])) for name in NAMES}
    link = bed["host3"].view(f"{DEPLOYMENT_DIR}/current").lstat().st_mtime_ns
    fleet["write"](extra_args={name: AFTER_FAULTS for name in NAMES}, max_unavailable=1)
    run = subprocess.Popen([PYINFRA, "-y", str(fleet["inventory"]), "deploy.py"], cwd=REPO_ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        rollout_support.wait_until(lambda: process_is_gone(before["host1"][1]) or run.poll() is not None,
                                   timeout=900, what="host1's restart (wave 1)", step=0.1)
        assert run.poll() is None, "the run ended before wave 1 restarted host1"
        bed["host2"].cut_ssh()
        output, _ = run.communicate(timeout=900)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode != 0, output[-5000:]
    assert "--> Rollout stopped in wave 2 of 3: host2" in output, output[-5000:]
    assert "[host3] held: the rollout stopped before wave 3 of 3 (host3): host2" in output, output[-5000:]
    assert serves_with(bed, "host1", AFTER_FAULTS)
    for name in ("host2", "host3"):  # serving what they served
        assert (current_release(bed[name]), read_pid(bed[name])) == before[name], name
        assert complete(PORTS[name])["choices"][0]["text"] is not None
    assert bed["host3"].view(f"{DEPLOYMENT_DIR}/current").lstat().st_mtime_ns == link
    fleet["host1 after the cut"] = read_pid(bed["host1"])
    bed["host2"].restore_ssh()


def test_a_control_run_killed_mid_wave_is_converged_by_the_next_restarting_no_host_twice(fleet):
    """The run after the cut is SIGKILLed as host2's restart begins (wave 2): the run after it recovers the
    stale locks, restarts neither host1 (on the new release since the run before) nor anything twice, and
    converges host2 and host3; no lock is left."""
    import subprocess

    from conftest import PYINFRA, REPO_ROOT
    from testbed.ssh_hosts import process_is_gone

    bed = fleet["bed"]
    host1_pid = fleet["host1 after the cut"]
    host2_pid = read_pid(bed["host2"])
    run = subprocess.Popen([PYINFRA, "-y", str(fleet["inventory"]), "deploy.py"], cwd=REPO_ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        rollout_support.wait_until(lambda: process_is_gone(host2_pid) or run.poll() is not None,
                                   timeout=900, what="host2's restart (wave 2)", step=0.05)
        assert run.poll() is None, "the run ended before wave 2 restarted host2"
    finally:
        run.kill()
        run.wait()
    assert read_pid(bed["host1"]) == host1_pid
    stale = {name for name in NAMES if bed[name].run(f"test -e {TEST_ROOT}/deploy.lock").returncode == 0}
    assert stale, "the killed run left no lock: it was not killed while it held the hosts"

    converged = run_pyinfra(fleet["inventory"])
    assert converged.returncode == 0, converged.output[-5000:]
    assert "--> Rollout: all 3 waves rolled out" in converged.output, converged.output[-5000:]
    assert converged.output.count("recovered a stale lock of pyinfra run of ") >= len(stale), converged.output[-5000:]
    assert read_pid(bed["host1"]) == host1_pid, "host1 was on the new release already and was restarted"
    for name in NAMES:
        assert serves_with(bed, name, AFTER_FAULTS), name
        assert complete(PORTS[name])["choices"][0]["text"] is not None
        assert bed[name].run(f"test -e {TEST_ROOT}/deploy.lock").returncode != 0, f"{name} kept a lock"


def test_a_host_whose_disk_cannot_hold_the_new_checkpoint_holds_the_rollout_before_any_byte(fleet):
    """The site moves every host to another checkpoint; host3's models folder is a 1 MB file system. The run is
    refused while it is prepared, naming host3, the checkpoint and the needed and free figures: no host
    fetches a byte, switches or restarts (the whole rollout holds; the others keep serving)."""
    bed = fleet["bed"]
    before = {name: (current_release(bed[name]), read_pid(bed[name]),
                     bed[name].run(f"ls {DEPLOYMENT_DIR}/releases").stdout) for name in NAMES}
    small = f"{TEST_ROOT}/models/heavylift--tiny-llama-tp8"
    mounted = bed["host3"].run(f"mkdir -p {small} && mount -t tmpfs -o size=1m tmpfs {small}")
    assert mounted.returncode == 0, mounted.stderr
    try:
        fleet["write"](extra_args={name: AFTER_FAULTS for name in NAMES}, max_unavailable=1, model="tiny-llama-tp8",
                       deployment="tiny-llama", disk_margin_gb=0)  # the same deployment, a new checkpoint
        refused = run_pyinfra(fleet["inventory"])
    finally:
        fleet["write"](extra_args={name: AFTER_FAULTS for name in NAMES}, max_unavailable=1)
        bed["host3"].run(f"umount {small}")
    assert refused.returncode != 0, refused.output[-5000:]
    assert re.search(r"host3: heavylift/tiny-llama-tp8@[0-9a-f]{12}: [\d.]+ [kM]B still to download but "
                     rf"{re.escape(small)} has [\d.]+ [kM]B free \(margin 0 GB\)", refused.output), refused.output[-5000:]
    for name in NAMES:
        assert (current_release(bed[name]), read_pid(bed[name]),
                bed[name].run(f"ls {DEPLOYMENT_DIR}/releases").stdout) == before[name], name
        assert bed[name].run(f"ls -A {small} 2>/dev/null").stdout == "", name  # not a byte, anywhere
        assert complete(PORTS[name])["choices"][0]["text"] is not None


def test_a_site_that_says_proceed_leaves_the_small_disk_host_out_and_converges_the_others(fleet):
    """The same small disk on host3, and the site says ``when_disk_too_small: proceed`` (two hosts at a time):
    host3 gets nothing but its failure (no lock, no byte, the same vLLM), its refusal holds no wave, host1 and host2
    move to the new checkpoint and serve it, and the run fails naming host3."""
    bed = fleet["bed"]
    before = {name: (current_release(bed[name]), read_pid(bed[name])) for name in NAMES}
    small = f"{TEST_ROOT}/models/heavylift--tiny-llama-tp8"
    mounted = bed["host3"].run(f"mkdir -p {small} && mount -t tmpfs -o size=1m tmpfs {small}")
    assert mounted.returncode == 0, mounted.stderr
    try:
        fleet["write"](extra_args={name: AFTER_FAULTS for name in NAMES}, max_unavailable=2, model="tiny-llama-tp8",
                       deployment="tiny-llama", disk_margin_gb=0, when_disk_too_small="proceed")
        run = run_pyinfra(fleet["inventory"])
        host3_files = bed["host3"].run(f"ls -A {small}").stdout
    finally:
        bed["host3"].run(f"umount {small}")
    output = run.output
    assert run.returncode != 0, output[-5000:]
    assert re.search(r"\[host3\] refused, left untouched: host3: heavylift/tiny-llama-tp8@[0-9a-f]{12}: [\d.]+ [kM]B still "
                     rf"to download but {re.escape(small)} has", output), output[-5000:]
    assert "--> Rolling out in 2 waves (tiny-llama: 2 at a time): 1: host1, host2; 2: host3" in output, output[-5000:]
    assert "held" not in output.split("--> Rolling out", 1)[-1], output[-5000:]  # host3 held no wave
    assert (current_release(bed["host3"]), read_pid(bed["host3"])) == before["host3"] and host3_files == ""
    assert bed["host3"].run(f"test -e {TEST_ROOT}/deploy.lock").returncode != 0
    assert complete(PORTS["host3"])["choices"][0]["text"] is not None
    for name in ("host1", "host2"):
        assert current_release(bed[name]) != before[name][0] and running_release(bed[name]) == current_release(bed[name])
        status = json.loads(bed[name].run(f"cat {DEPLOYMENT_DIR}/status.json").stdout)
        assert status["healthy"] and status["release"] == current_release(bed[name]), status
        assert "tiny-llama-tp8" in json.dumps(status), status

