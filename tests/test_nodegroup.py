"""A multi-node group rolled out as one unit (operations/nodegroup.py), through the real pyinfra 3.10 CLI and
heavylift's own switch (release.current), service (service.daemon, start-stop-daemon) and gate
(readiness.serving) operations, with a stand-in for vLLM (testbed/stub_vllm.py, testbed/group_deploy.py)
whose API answers only while every node runs the leader's release, as a TP/PP group does:

- a no-op re-run restarts no node;
- a change on the worker alone restarts both nodes (the leader too) and the group serves;
- a release that fails the leader's gate puts both nodes back on their previous release together, the
  leader's gate passes again on it, and the run fails saying so;
- a dry run shows a change on one node as the restart (and gate) of both;
- a node whose vLLM died, or that runs another release than ``current`` (a run killed between its switch
  and its restart), restarts with its whole group, not alone.

Two hosts through pyinfra's @chroot connector into this machine's own / (as tests/test_waves.py); the
stand-ins are processes this test starts and stops. The same logic with real vLLM over two network
namespaces: tests/test_e2e_multinode.py.

Without processes (the fast tier): which node's change or dead vLLM restarts the group
(``nodegroup.restart_causes``), and status.py's judgement of a group from its hosts' states
(``nodegroup.group_status``).
"""

import os
import re
import shutil
import signal
import time
from types import SimpleNamespace

import pytest
from pyinfra.api import Config, Inventory, State

from conftest import run_pyinfra
from operations import nodegroup
from testbed.ssh_hosts import find_free_port

# the tests that run the real pyinfra over two hosts with processes to start and stop (a few seconds each)
# are the full suite's, not the fast tier's (./test.sh --fast)
e2e = pytest.mark.e2e

NAMES = ("@chroot//", "@chroot//.")
DEPLOY = "testbed/group_deploy.py"


@pytest.fixture()
def group(tmp_path):
    port = find_free_port()
    folders = [tmp_path / "leader", tmp_path / "worker"]
    data = [{"folder": str(folder), "rank": rank, "group": list(NAMES), "port": port} for rank, folder in enumerate(folders)]
    data[0]["workers"] = [data[1]]
    inventory = tmp_path / "site.py"
    inventory.write_text(f"hosts = {list(zip(NAMES, data))!r}\n")
    yield folders, inventory
    for folder in folders:  # stop what the test started
        pid = pid_of(folder)
        if pid:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def pid_of(folder):
    found = folder / "run" / "serve.pid"
    return int(found.read_text().split()[0]) if found.exists() else None


def running(folder):
    """(pid, the release its process was started from, the release `current` names)."""
    pid = pid_of(folder)
    started_from = os.path.basename(os.readlink(f"/proc/{pid}/cwd")) if pid and os.path.exists(f"/proc/{pid}") else None
    return pid, started_from, os.path.basename(os.readlink(folder / "current"))


@e2e
def test_the_group_restarts_whole_and_rolls_back_together(group):
    folders, inventory = group
    first = run_pyinfra(inventory, "--data", "release=r1", deploy=DEPLOY)
    assert first.returncode == 0, first.output[-4000:]
    leader0, worker0 = running(folders[0]), running(folders[1])
    assert leader0[1:] == ("r1", "r1") and worker0[1:] == ("r1", "r1"), (leader0, worker0)
    assert "the group's leader @chroot// passed its gate; this node serves with it" in first.output

    again = run_pyinfra(inventory, "--data", "release=r1", deploy=DEPLOY)
    assert again.returncode == 0 and again.changed_operations() == [], again.output[-4000:]
    assert (running(folders[0]), running(folders[1])) == (leader0, worker0)  # no node restarted

    # a change on the worker alone: the leader's switch does nothing, yet it restarts with its group
    worker_only = run_pyinfra(inventory, "--data", "release=r1", "--data", "worker_release=r1+w", deploy=DEPLOY)
    assert worker_only.returncode == 0, worker_only.output[-4000:]
    leader1, worker1 = running(folders[0]), running(folders[1])
    assert leader1[0] != leader0[0] and leader1[1:] == ("r1", "r1"), (leader0, leader1)
    assert worker1[0] != worker0[0] and worker1[1:] == ("r1+w", "r1+w"), (worker0, worker1)
    assert re.search(r"\[@chroot//\] +restarted with its group: @chroot//\. changed", worker_only.output), \
        worker_only.output[-4000:]

    # the leader's new release exits at start: both go back, each to its own previous release, together
    failed = run_pyinfra(inventory, "--data", "release=r2", "--data", "bad=r2", deploy=DEPLOY)
    assert failed.returncode != 0, failed.output[-4000:]
    leader2, worker2 = running(folders[0]), running(folders[1])
    assert leader2[1:] == ("r1", "r1") and worker2[1:] == ("r1+w", "r1+w"), (leader2, worker2)
    assert "failed its readiness gate and the group (@chroot//, @chroot//.) was rolled back together" in failed.output
    assert "this node goes back to release r1+w with it" in failed.output, failed.output[-4000:]
    assert "unrecognized arguments: --no-such-flag" in failed.output
    # and it serves again: a run of the old releases changes nothing
    back = run_pyinfra(inventory, "--data", "release=r1", "--data", "worker_release=r1+w", deploy=DEPLOY)
    assert back.returncode == 0, back.output[-4000:]


def service_changes(output: str) -> str:
    """The service and gate rows of pyinfra's "Detected changes" table."""
    return "\n".join(line for line in output.splitlines() if "service (start-stop-daemon)" in line or "vLLM ready" in line)


@e2e
def test_a_dry_run_shows_a_change_on_one_node_as_the_restart_of_both(group):
    folders, inventory = group
    assert run_pyinfra(inventory, "--data", "release=r1", deploy=DEPLOY).returncode == 0
    before = (running(folders[0]), running(folders[1]))
    # the worker alone changes: the leader's switch does nothing, yet it restarts and gates with its group
    dry = run_pyinfra(inventory, "--dry", "--data", "release=r1", "--data", "worker_release=r1+w", deploy=DEPLOY)
    assert dry.returncode == 0, dry.output[-4000:]
    rows = service_changes(dry.output)
    assert re.search(r"service \(start-stop-daemon\) +2 \(@chroot//, @chroot//\.\)", rows), dry.output[-4000:]
    assert re.search(r"vLLM ready +2 \(@chroot//, @chroot//\.\)", rows), dry.output[-4000:]
    assert (running(folders[0]), running(folders[1])) == before  # a dry run restarts nothing


def wait_gone(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        with open(f"/proc/{pid}/status") as status:  # a zombie is gone too
            if any(line.startswith("State:") and "Z" in line for line in status):
                return
        time.sleep(0.1)


@e2e
def test_a_node_whose_vllm_died_restarts_with_its_whole_group(group):
    folders, inventory = group
    assert run_pyinfra(inventory, "--data", "release=r1", deploy=DEPLOY).returncode == 0
    leader0, worker0 = running(folders[0]), running(folders[1])
    os.kill(worker0[0], signal.SIGKILL)
    wait_gone(worker0[0])

    dry = run_pyinfra(inventory, "--dry", "--data", "release=r1", deploy=DEPLOY)
    assert re.search(r"service \(start-stop-daemon\) +2 \(@chroot//, @chroot//\.\)", service_changes(dry.output)), \
        dry.output[-4000:]

    again = run_pyinfra(inventory, "--data", "release=r1", deploy=DEPLOY)
    assert again.returncode == 0, again.output[-4000:]
    leader1, worker1 = running(folders[0]), running(folders[1])
    # both nodes started anew, as one group: the leader too, though nothing of it changed
    assert leader1[0] != leader0[0] and worker1[0] != worker0[0], (leader0, leader1, worker0, worker1)
    assert leader1[1:] == ("r1", "r1") and worker1[1:] == ("r1", "r1"), (leader1, worker1)
    assert re.search(r"\[@chroot//\] +restarted with its group: @chroot//\.: vLLM is not running", again.output), \
        again.output[-4000:]
    assert "the group's leader @chroot// passed its gate; this node serves with it" in again.output


@e2e
def test_a_node_on_a_stale_release_restarts_with_its_whole_group(group):
    folders, inventory = group
    assert run_pyinfra(inventory, "--data", "release=r1", deploy=DEPLOY).returncode == 0
    leader0, worker0 = running(folders[0]), running(folders[1])
    # a run killed between the leader's switch and its restart: `current` names r1+x, its vLLM still runs r1
    releases = folders[0] / "releases"
    shutil.copytree(releases / "r1", releases / "r1+x")
    (folders[0] / "previous").symlink_to("releases/r1")
    (folders[0] / "current").unlink()
    (folders[0] / "current").symlink_to("releases/r1+x")

    again = run_pyinfra(inventory, "--data", "release=r1+x", "--data", "worker_release=r1", deploy=DEPLOY)
    assert again.returncode == 0, again.output[-4000:]
    leader1, worker1 = running(folders[0]), running(folders[1])
    assert leader1[0] != leader0[0] and leader1[1:] == ("r1+x", "r1+x"), (leader0, leader1)
    # nothing of the worker changed, and it still restarts: its peer's new start needs a new one of it
    assert worker1[0] != worker0[0] and worker1[1:] == ("r1", "r1"), (worker0, worker1)
    assert re.search(rf"\[@chroot//\.\] +restarted with its group: @chroot//: vLLM \(pid {leader0[0]}\) runs release r1, "
                     r"not the current release r1\+x", again.output), again.output[-4000:]


# --- without processes ---------------------------------------------------------------------------------------


class Meta:
    """An OperationMeta as nodegroup reads it: planned (``_maybe_is_change``) or executed (did it change)."""

    def __init__(self, op_hash, planned=None, changed=None):
        self._hash, self._maybe_is_change, self.changed = op_hash, planned, changed

    @property
    def will_change(self):
        return bool(self._maybe_is_change)

    def is_complete(self):
        return self.changed is not None

    def did_change(self):
        return bool(self.changed)


class Node:
    """A host as nodegroup reads it (pyinfra's Host is keyed by identity in ``state.ops``)."""

    def __init__(self, name):
        self.name, self.current_op_hash = name, None


class RunState:
    """What nodegroup reads of pyinfra's state: the inventory, each host's operations, the failed hosts."""

    def __init__(self, names, executing=True):
        self.hosts = {name: Node(name) for name in names}
        self.inventory = SimpleNamespace(get_host=self.hosts.get)
        self.is_executing, self.failed_hosts, self.callback_handlers = executing, set(), []
        self.ops = {host: {} for host in self.hosts.values()}
        self.counts = {host: SimpleNamespace(ops_change=0, ops_no_change=1) for host in self.hosts.values()}

    def add_callback_handler(self, handler):
        self.callback_handlers.append(handler)

    def get_meta_for_host(self, host):
        return self.counts[host]

    def planned(self, name, meta):
        self.ops[self.hosts[name]][meta._hash] = SimpleNamespace(operation_meta=meta)
        return meta


GROUP = ("node0", "node1")


def test_a_node_whose_vllm_must_start_restarts_the_others_but_a_failed_one_does_not():
    state = RunState(GROUP)
    node0, node1 = state.hosts["node0"], state.hosts["node1"]
    switched0 = state.planned("node0", Meta("switch", changed=False))
    state.planned("node1", Meta("switch", changed=False))
    assert nodegroup.restart_causes(state, node0, [switched0], GROUP) == {}
    nodegroup.post_start_reason(state, node0, GROUP, None)
    nodegroup.post_start_reason(state, node1, GROUP, "vLLM is not running")
    assert nodegroup.restart_causes(state, node0, [switched0], GROUP) == {"node1": "vLLM is not running"}
    # a node's own reason is its own start's (the service operation starts it); its peers restart with it
    assert nodegroup.restart_causes(state, node1, [state.ops[node1]["switch"].operation_meta], GROUP) == {}
    # a node whose run failed before its service starts nothing: its peer is left as it runs
    state.failed_hosts.add(node1)
    assert nodegroup.restart_causes(state, node0, [switched0], GROUP) == {}


def test_a_change_on_another_node_counts_once_it_ran_or_was_planned():
    state = RunState(GROUP)
    node0 = state.hosts["node0"]
    switched0 = state.planned("node0", Meta("switch", changed=False))
    state.planned("node1", Meta("switch", changed=True))
    assert nodegroup.restart_causes(state, node0, [switched0], GROUP) == {"node1": nodegroup.CHANGED}
    assert nodegroup.describe_causes({"node1": nodegroup.CHANGED, "node2": "vLLM is not running"}) == \
        "node1 changed; node2: vLLM is not running"
    planning = RunState(GROUP, executing=False)
    switched0 = planning.planned("node0", Meta("switch", planned=False))
    assert nodegroup.restart_causes(planning, planning.hosts["node0"], [switched0], GROUP) == {}  # node1 not planned
    planning.planned("node1", Meta("switch", planned=True))
    assert nodegroup.restart_causes(planning, planning.hosts["node0"], [switched0], GROUP) == {"node1": "changed"}


def test_a_dry_run_marks_the_same_operation_on_the_nodes_planned_before():
    state = RunState(GROUP, executing=False)
    node0, node1 = state.hosts["node0"], state.hosts["node1"]
    earlier = state.planned("node0", Meta("service", planned=False))
    node1.current_op_hash = "service"
    nodegroup.group_changes(state, node1, GROUP)
    assert earlier._maybe_is_change is True
    assert (state.counts[node0].ops_change, state.counts[node0].ops_no_change) == (1, 0)
    nodegroup.group_changes(state, node1, GROUP)  # counted once
    assert (state.counts[node0].ops_change, state.counts[node0].ops_no_change) == (1, 0)
    state.is_executing = True
    later = state.planned("node0", Meta("gate", planned=False))
    node1.current_op_hash = "gate"
    nodegroup.group_changes(state, node1, GROUP)  # executing: what runs decides, not the table
    assert later._maybe_is_change is False


def deployment_state(rank, service, current="aaaaaaaaaaaa", running=None, nnodes=2):
    return {"deployments": {"tiny": {
        "current": current, "node": {"rank": rank, "nnodes": nnodes, "leader": "10.0.0.1:29501"},
        "service": {**service, "running_release": running},
    }}}


ACTIVE = {"state": "active", "detail": "pid 10 running", "pid": 10, "last_error": None}


def test_status_judges_a_group_failed_naming_the_node_whose_vllm_died():
    dead = {"state": "failed", "detail": "pid 11 in /opt/heavylift/deployments/tiny/run/serve.pid is gone; "
            "nothing restarts it", "pid": 11, "last_error": "Killed"}
    groups = nodegroup.group_status({"node0": deployment_state(0, ACTIVE), "node1": deployment_state(1, dead),
                                     "alone": {"deployments": {"other": {"node": None, "service": ACTIVE}}}})
    assert groups == [{
        "deployment": "tiny", "nodes": ["node0", "node1"], "state": "failed",
        "problems": ["node1 (rank 1, headless): vLLM failed, pid 11 in /opt/heavylift/deployments/tiny/run/serve.pid "
                     "is gone; nothing restarts it; last error: Killed"],
    }]
    assert nodegroup.group_line(groups[0]) == (
        "group tiny (node0, node1): failed: node1 (rank 1, headless): vLLM failed, pid 11 in "
        "/opt/heavylift/deployments/tiny/run/serve.pid is gone; nothing restarts it; last error: Killed. "
        "The next deploy run restarts the group as one")


def test_status_judges_a_whole_group_active_and_says_what_it_could_not_read():
    whole = nodegroup.group_status({"node0": deployment_state(0, ACTIVE), "node1": deployment_state(1, ACTIVE)})
    assert [(g["state"], g["problems"]) for g in whole] == [("active", [])]
    assert nodegroup.group_line(whole[0]) == "group tiny (node0, node1): active"
    stale = nodegroup.group_status({"node0": deployment_state(0, ACTIVE, running="bbbbbbbbbbbb"),
                                    "node1": deployment_state(1, ACTIVE)})
    assert stale[0]["state"] == "stale"
    assert stale[0]["problems"] == ["node0 (rank 0, leader): runs release bbbbbbbbbbbb, not current aaaaaaaaaaaa"]
    half = nodegroup.group_status({"node0": deployment_state(0, ACTIVE)})
    assert (half[0]["nodes"], half[0]["state"]) == (["node0", None], "unknown")
    assert half[0]["problems"] == ["node rank 1: not read (not in this run, not reached, or not deployed there)"]


def reading_run(names):
    """A real pyinfra State whose hosts ``names`` are the run's (their connections opened)."""
    state = State(Inventory(([(name, {}) for name in names], {})), Config())
    for host in state.inventory:
        state.activate_host(host)
    return state


def test_status_says_each_group_once_every_host_is_read_on_its_leaders_lines(caplog):
    caplog.set_level("INFO", logger="pyinfra")
    state = reading_run(["node1", "node0"])
    node0, node1 = state.inventory.get_host("node0"), state.inventory.get_host("node1")
    nodegroup.groups_reported(state, node1, deployment_state(1, ACTIVE))
    assert caplog.records == []  # node0 not read yet: it judges the group
    nodegroup.groups_reported(state, node0, deployment_state(0, ACTIVE))
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", f"{node0.print_prefix}group tiny (node0, node1): active")]
    assert nodegroup.board_of(state).groups[0]["state"] == "active"


def test_status_says_a_group_whose_leader_was_not_read_on_the_first_node_read(caplog):
    caplog.set_level("INFO", logger="pyinfra")
    state = reading_run(["node1"])
    node1 = state.inventory.get_host("node1")
    nodegroup.groups_reported(state, node1, deployment_state(1, ACTIVE))
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"{node1.print_prefix}group tiny (?, node1): unknown: node rank 0: not read (not in this run, "
                    "not reached, or not deployed there)")]
    # another run in the same process judges its own hosts
    other = reading_run(["solo"])
    nodegroup.groups_reported(other, other.inventory.get_host("solo"), {"deployments": {}})
    assert nodegroup.board_of(other).groups == [] and len(caplog.records) == 1
