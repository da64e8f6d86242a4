"""End to end, one vLLM instance over two hosts: two SSH test hosts in network namespaces of their own on a
bridge (testbed ``network="bridge"``), vLLM's CPU build serving the tiny Llama split across both with
pipeline parallel 2 over Gloo (vLLM's own multi-node launch: ``--nnodes 2 --node-rank R --master-addr``,
``--headless`` on node1), the real pyinfra CLI running deploy.py from the bridge's control side:

(a) a first run converges both nodes; a real completion through the leader's API, asked from node1;
(b) a re-run changes nothing and restarts no node;
(c) a changed flag (``--max-num-seqs``) restarts both nodes, and the group serves again;
(d) an upgrade whose flag vLLM rejects at start fails the leader's gate: both nodes go back to their
    previous release together, the group serves it again, and the run exits non-zero saying so;
(e) node1's vLLM killed (SIGKILL): status.py reports the group failed, naming node1 and its dead vLLM; a dry
    run shows both nodes' restart; the next run restarts both nodes as one group, and it serves again.

One bed and one Hub mirror (olah, in the bridge's switch namespace) for the module. The restart-whole and
rollback-together logic is also proven in seconds with a stand-in for vLLM (tests/test_nodegroup.py).
"""

import json
import platform
import shutil
import subprocess
import time

import pytest

from conftest import PYINFRA, REPO_ROOT, TEST_ROOT, VLLM_CPU, PyinfraRun, tiny_site_data
from models.schema import SiteSettings, VllmRuntime
from operations import runtime
from resolve import vllm_build
from rollout_support import status, wait_until
from testbed.hub_mirror import HubMirror
from testbed.ssh_hosts import TestBed

pytestmark = pytest.mark.e2e

NAMES = ("node0", "node1")
PORT, MIRROR_PORT = 8000, 8390  # the same on every namespace of the bridge: each has its own ports
DEPLOYMENT_DIR = f"{TEST_ROOT}/deployments/tiny-llama"
PIDFILE = f"{DEPLOYMENT_DIR}/run/serve.pid"
# The catalog's --enforce-eager breaks pipeline parallel on the CPU build (rule pp-cpu-enforce-eager): its
# warm-up allocates a later stage's receive buffers. Tracing once with the eager backend keeps the warm-up and
# skips Inductor's compile, most of a start on two shared cores (what vLLM's CPU CI runs, VLLM_CPU_CI_ENV).
FAST_START = ["--no-enforce-eager", "--compilation-config", '{"mode": 2, "backend": "eager"}']


def completion_from(host, leader_address):
    """A completion through the leader's API, asked from inside ``host``'s network namespace."""
    script = (
        "import json, sys, urllib.request; "
        "body = json.dumps({'model': 'heavylift/tiny-llama', 'prompt': 'Hello', 'max_tokens': 4}).encode(); "
        f"req = urllib.request.Request('http://{leader_address}:{PORT}/v1/completions', data=body, "
        "headers={'Content-Type': 'application/json'}); "
        "print(json.dumps(json.load(urllib.request.urlopen(req, timeout=120))))"
    )
    done = host.run(["python3", "-c", script], timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def node_state(host):
    """(vLLM's pid, the release its process runs, the release `current` names)."""
    pid = host.run(f"cat {PIDFILE}").stdout.strip()
    running = host.run(f"readlink /proc/{pid}/cwd").stdout.strip().rsplit("/", 1)[-1] if pid else ""
    current = host.run(f"readlink {DEPLOYMENT_DIR}/current").stdout.strip().rsplit("/", 1)[-1]
    return pid, running, current


@pytest.fixture(scope="module")
def group(tmp_path_factory, hub_mirror, warm_uv_cache, venv_seed):
    base = tmp_path_factory.mktemp("multinode")
    # the control machine reaches the package index, the bridge does not: the build is resolved here once and
    # kept (resolve/plancache.py), as a site's control machine resolves it before it reaches air-gapped hosts
    vllm_build.resolve(VllmRuntime.model_validate(VLLM_CPU))
    # and so is the uv binary heavylift puts on each host (PyPI's uv wheel, cached on the control machine)
    runtime.local_uv_binary(SiteSettings.model_fields["uv_version"].default, platform.machine())
    bed = TestBed(base / "bed", names=list(NAMES), network="bridge", seeds=venv_seed)
    mirror = None
    try:
        # a mirror of its own, in the switch namespace where the hosts and the control side reach it
        mirror_dir = base / "mirror"
        shutil.copytree(hub_mirror.dir, mirror_dir, symlinks=True, ignore=shutil.ignore_patterns("logs", "*.log"))
        mirror = HubMirror(mirror_dir, host=bed.network.switch_address, port=MIRROR_PORT,
                           netns_path=bed.network.switch_path).start()
        inventory = base / "site.py"
        leader_address = bed.network.hosts["node0"]

        def write(extra_args):
            bed.write_inventory(inventory, host_data={
                name: tiny_site_data(
                    mirror.url, warm_uv_cache, port=PORT, bind_address="0.0.0.0", readiness_timeout=900,
                    service_manager="fallback", shutdown_timeout=5, benchmark_tokens=0, extra_args=extra_args,
                    # the bridge reaches no registry: the venvs come from the warm shared cache alone
                    uv_offline=True,
                    multinode={"node_rank": rank, "pipeline_parallel_size": 2, "interface": "eth0"},
                ) for rank, name in enumerate(NAMES)
            })

        def run(*args):
            started = time.monotonic()
            # -y skips pyinfra's change detection, which a dry run shows
            confirm = [] if "--dry" in args else ["-y"]
            done = subprocess.run(bed.control_argv([PYINFRA, *confirm, str(inventory), "deploy.py", *args]),
                                  cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800)
            result = PyinfraRun(done.returncode, done.stdout + done.stderr)
            result.seconds = time.monotonic() - started
            return result

        yield {"bed": bed, "write": write, "run": run, "leader": leader_address,
               "status": lambda: status(inventory, control=bed.control_argv)}
    finally:
        if mirror is not None:
            mirror.stop()
        bed.stop(remove="later")


def test_a_first_run_serves_one_model_over_two_nodes(group):
    bed = group["bed"]
    group["write"](FAST_START)
    first = group["run"]()
    print(f"\nfirst run of the two-node group: {first.seconds:.0f} s")
    assert first.returncode == 0, first.output[-6000:]
    assert "the group's leader node0 passed its gate; this node serves with it" in first.output, first.output[-4000:]
    answer = completion_from(bed["node1"], group["leader"])
    assert answer["choices"][0]["text"] is not None and answer["usage"]["completion_tokens"] == 4
    # the worker really is the second pipeline stage: headless, rank 1, the leader as its master
    argv = bed["node1"].run(f"tr '\\0' ' ' < /proc/$(cat {PIDFILE})/cmdline").stdout
    assert "--headless" in argv and "--node-rank 1" in argv and f"--master-addr {group['leader']}" in argv, argv
    group["before"] = {name: node_state(bed[name]) for name in NAMES}


def test_b_a_rerun_restarts_no_node(group):
    bed = group["bed"]
    again = group["run"]()
    assert again.returncode == 0, again.output[-6000:]
    assert again.changed_operations() == [], again.output[-6000:]
    assert {name: node_state(bed[name]) for name in NAMES} == group["before"]
    print(f"\nconverged re-run of the two-node group: {again.seconds:.1f} s")


def test_c_a_changed_flag_restarts_both_nodes(group):
    bed = group["bed"]
    group["write"]([*FAST_START, "--max-num-seqs", "4"])
    changed = group["run"]()
    print(f"\nchanged flag, both nodes restarted: {changed.seconds:.0f} s")
    assert changed.returncode == 0, changed.output[-6000:]
    after = {name: node_state(bed[name]) for name in NAMES}
    for name in NAMES:
        pid, running, current = after[name]
        assert pid != group["before"][name][0] and running == current != group["before"][name][2], (name, after)
    assert completion_from(bed["node1"], group["leader"])["usage"]["completion_tokens"] == 4
    group["serving"] = after


def test_d_a_failed_upgrade_rolls_both_nodes_back_together(group):
    bed = group["bed"]
    group["write"]([*FAST_START, "--max-num-seqs", "4", "--no-such-vllm-flag"])
    failed = group["run"]()
    print(f"\nfailed upgrade rolled back on both nodes: {failed.seconds:.0f} s")
    assert failed.returncode != 0, failed.output[-6000:]
    assert "the group (node0, node1) was rolled back together" in failed.output, failed.output[-6000:]
    assert "the group's leader node0 failed its readiness gate; this node goes back to release" in failed.output
    for name in NAMES:
        pid, running, current = node_state(bed[name])
        # each node runs the release it ran before the upgrade, from `current` again
        assert running == current == group["serving"][name][2], (name, pid, running, current)
    assert completion_from(bed["node1"], group["leader"])["usage"]["completion_tokens"] == 4


def gone(host, pid):
    """Whether ``pid`` on ``host`` has exited (a zombie not yet reaped has)."""
    return host.run(f"grep -qs '^State:[[:space:]]*[^ZX]' /proc/{pid}/status").returncode != 0


def test_e_a_dead_node_fails_its_group_and_the_next_run_restarts_both(group):
    bed = group["bed"]
    # the site as the group serves it (the release (c) started and (d) went back to), and each node's staging
    # launcher as that release has it (the failed upgrade of (d) left its own there; a converged run would put it
    # back, restarting the group, minutes): nothing of either node changes, so a restart of node0 is its group's
    group["write"]([*FAST_START, "--max-num-seqs", "4"])
    for name in NAMES:
        bed[name].run(f"cp -p {DEPLOYMENT_DIR}/current/serve {DEPLOYMENT_DIR}/serve")
    before = {name: node_state(bed[name]) for name in NAMES}
    dead = before["node1"][0]
    # the headless worker's vLLM killed as the OOM killer would (SIGKILL): nothing restarts it, and the leader
    # is left waiting on a pipeline stage that is gone
    bed["node1"].run(f"kill -KILL {dead}")
    wait_until(lambda: gone(bed["node1"], dead), 30, f"node1's vLLM (pid {dead}) gone")

    found = group["status"]()
    print(f"\nstatus of the group with node1 dead: {found.seconds:.1f} s")
    assert found.run.returncode == 0, found.run.output[-4000:]
    [judged] = found.document["groups"]
    assert (judged["deployment"], judged["nodes"], judged["state"]) == ("tiny-llama", list(NAMES), "failed"), judged
    assert any(problem.startswith(f"node1 (rank 1, headless): vLLM failed, pid {dead} ") for problem in judged["problems"]), \
        judged
    assert "[node0] group tiny-llama (node0, node1): failed: " in found.run.output.replace("  ", " "), found.run.output[-4000:]
    leader_alive = found.document["hosts"]["node0"]["deployments"]["tiny-llama"]["service"]["state"] == "active"

    # a dry run shows the restart of both nodes, the leader's too though nothing of it changed
    preview = group["run"]("--dry")
    assert preview.returncode == 0, preview.output[-6000:]
    rows = [line for line in preview.output.splitlines() if "service (start-stop-daemon)" in line or "vLLM ready" in line]
    assert len(rows) == 2 and all("2 (node0, node1)" in row for row in rows), preview.output[-6000:]

    again = group["run"]()
    print(f"\nthe group restarted after node1's vLLM died: {again.seconds:.0f} s (the leader was "
          f"{'still running' if leader_alive else 'gone too'})")
    assert again.returncode == 0, again.output[-6000:]
    after = {name: node_state(bed[name]) for name in NAMES}
    for name in NAMES:
        pid, running, current = after[name]
        # a new start of both, from the release they served
        assert pid != before[name][0] and running == current == before[name][2], (name, before, after)
    if leader_alive:
        assert "restarted with its group: node1: vLLM is not running" in again.output, again.output[-6000:]
    assert "the group's leader node0 passed its gate; this node serves with it" in again.output
    assert completion_from(bed["node1"], group["leader"])["usage"]["completion_tokens"] == 4
    assert [g["state"] for g in group["status"]().document["groups"]] == ["active"]
