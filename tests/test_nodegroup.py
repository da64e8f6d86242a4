"""A multi-node group rolled out as one unit (operations/nodegroup.py), through the real pyinfra 3.10 CLI and
heavylift's own switch (release.current), service (service.daemon, start-stop-daemon) and gate
(readiness.serving) operations, with a stand-in for vLLM (testbed/stub_vllm.py, testbed/group_deploy.py)
whose API answers only while every node runs the leader's release, as a TP/PP group does:

- a no-op re-run restarts no node;
- a change on the worker alone restarts both nodes (the leader too) and the group serves;
- a release that fails the leader's gate puts both nodes back on their previous release together, the
  leader's gate passes again on it, and the run fails saying so.

Two hosts through pyinfra's @chroot connector into this machine's own / (as tests/test_waves.py); the
stand-ins are processes this test starts and stops. The same logic with real vLLM over two network
namespaces: tests/test_e2e_multinode.py.
"""

import os
import re
import signal

import pytest

from conftest import run_pyinfra
from testbed.ssh_hosts import find_free_port

# five real pyinfra runs over two hosts with processes to start and stop (~15 s): the full suite's,
# not the fast tier's (./test.sh --fast)
pytestmark = pytest.mark.e2e

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
