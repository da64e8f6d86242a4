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
from conftest import TEST_ROOT, run_pyinfra, tiny_site_data
from testbed.ssh_hosts import find_free_port

pytestmark = pytest.mark.e2e

NAMES = ("host1", "host2", "host3")
# the test hosts share this machine's network: each host's vLLM gets a port of its own
PORTS: dict[str, int] = {}
for _name in NAMES:
    while (port := find_free_port()) in PORTS.values():
        pass
    PORTS[_name] = port
DEPLOYMENT_DIR = f"{TEST_ROOT}/deployments/tiny-llama"
PIDFILE = f"{DEPLOYMENT_DIR}/run/serve.pid"
# a good change for the whole fleet (a new release everywhere), and one vLLM refuses at start for host2
GOOD = ["--max-num-seqs", "4"]
BAD = [*GOOD, "--no-such-vllm-flag"]


def complete(port):
    body = json.dumps({"model": "heavylift/tiny-llama", "prompt": "Hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.load(answer)


def read_pid(host):
    return int(host.run(f"cat {PIDFILE}").stdout.strip())


def current_release(host):
    return host.run(f"readlink {DEPLOYMENT_DIR}/current").stdout.strip().rsplit("/", 1)[-1]


def running_release(host):
    return os.readlink(f"/proc/{read_pid(host)}/cwd").rsplit("/", 1)[-1]


@pytest.fixture(scope="module")
def fleet(testbed_factory, hub_mirror, warm_uv_cache, tmp_path_factory):
    started = time.monotonic()
    bed = testbed_factory(list(NAMES))
    inventory = tmp_path_factory.mktemp("waves") / "site.py"

    def write(extra_args=None, **site):
        extra_args = extra_args or {}
        bed.write_inventory(inventory, host_data={
            name: tiny_site_data(hub_mirror.url, warm_uv_cache, port=PORTS[name], readiness_timeout=900,
                                 service_manager="fallback", shutdown_timeout=5, benchmark_tokens=0,
                                 extra_args=extra_args.get(name, []), **site)
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
    return {"bed": bed, "inventory": inventory, "before": before, "rollout": rollout}


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
