"""End to end, the host lock over real SSH (one test host): a run gives the lock back at its end, a failed
run gives it back too, and only a run that died leaves it, which the next run recovers with a warning.

The deploy is testbed/lock_deploy.py: the lock exactly as deploy.py holds it (``hostlock.hold`` before
any operation, ``hostlock.released`` as the last one) around a step that waits or fails. The real
deploy.py's no-op run is checked for the same in tests/test_e2e_rollout.py.
"""

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import PYINFRA, REPO_ROOT, run_pyinfra

pytestmark = pytest.mark.e2e

DEPLOY = str(REPO_ROOT / "testbed" / "lock_deploy.py")
LOCK = "/opt/heavylift/deploy.lock"


@pytest.fixture(scope="module")
def bed(testbed_factory, tmp_path_factory):
    bed = testbed_factory(["lock1"])
    bed.inventory = bed.write_inventory(tmp_path_factory.mktemp("lock") / "inventory.py")
    return bed


def lock_exists(bed) -> bool:
    return bed["lock1"].run(f"test -e {LOCK}").returncode == 0


def test_successive_runs_give_the_lock_back_and_never_recover_one(bed):
    for _ in range(2):
        run = run_pyinfra(bed.inventory, deploy=DEPLOY, timeout=120)
        assert run.returncode == 0, run.output[-3000:]
        assert "recovered a stale lock" not in run.output
        assert not lock_exists(bed), "the lock is left after a successful run"
        # giving it back is no change: a run that changed nothing says so
        assert run.operation_results()["deploy lock given back"][1] == "-", run.output[-3000:]
        assert run.changed_operations() == []


def test_a_failed_run_gives_the_lock_back(bed):
    failed = run_pyinfra(bed.inventory, "--data", "lock_fail=true", deploy=DEPLOY, timeout=120)
    assert failed.returncode != 0 and "this step fails" in failed.output, failed.output[-3000:]
    assert not lock_exists(bed), "a failed run left its lock"
    after = run_pyinfra(bed.inventory, deploy=DEPLOY, timeout=120)
    assert after.returncode == 0 and "recovered a stale lock" not in after.output, after.output[-3000:]


def test_a_killed_run_leaves_its_lock_and_the_next_run_recovers_it(bed):
    killed = subprocess.Popen([PYINFRA, "-y", str(bed.inventory), DEPLOY, "--data", "lock_hold_seconds=120"],
                              cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not bed["lock1"].run(f"test -s {LOCK}/holder.json").returncode == 0:
            assert time.monotonic() < deadline and killed.poll() is None, "the run never took the lock"
            time.sleep(0.2)
        holder = json.loads(bed["lock1"].run(f"cat {LOCK}/holder.json").stdout)
        assert f"(pid {killed.pid})" in holder["label"]
    finally:
        os.kill(killed.pid, signal.SIGKILL)  # as a power cut of the control machine: nothing runs after it
        killed.wait()
    # its SSH session ends with it
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{holder['pid']}") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert lock_exists(bed), "a run that died cannot give its lock back"

    after = run_pyinfra(bed.inventory, deploy=DEPLOY, timeout=120)
    assert after.returncode == 0, after.output[-3000:]
    assert "recovered a stale lock of pyinfra run of " in after.output
    assert f"(pid {killed.pid})" in after.output
    assert not lock_exists(bed)


def test_a_run_takes_the_lock_at_its_first_change_and_not_after_another_run_changed_the_host(bed):
    """A run looks at the lock with its other reads and takes it just before its first change, naming the
    generation it read. Another run that took the lock in between (and gave it back) makes that take fail:
    what the first run read is no longer true, so it changes nothing and says why."""
    marks = "/root/lock-steps.txt"
    bed["lock1"].run(f"rm -f {marks}")
    with open(bed.inventory.parent / "slow.log", "w+") as log:
        slow = subprocess.Popen([PYINFRA, "-y", str(bed.inventory), DEPLOY, "--data", "lock_pause_seconds=10",
                                 "--data", f"lock_write={marks}:slow"], cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while "a pause before the first change" not in (bed.inventory.parent / "slow.log").read_text():
                assert time.monotonic() < deadline and slow.poll() is None, "the slow run never reached its pause"
                time.sleep(0.2)
            # it has read the lock (free) and holds nothing yet: another run goes through in the meantime
            assert not lock_exists(bed)
            quick = run_pyinfra(bed.inventory, "--data", f"lock_write={marks}:quick", deploy=DEPLOY, timeout=120)
            assert quick.returncode == 0, quick.output[-3000:]
            slow.wait(timeout=120)
        finally:
            if slow.poll() is None:
                slow.kill()
        log.seek(0)
        output = log.read()
    assert slow.returncode != 0, output[-3000:]
    assert "another run changed the host after this run read it" in output, output[-3000:]
    assert "nothing was changed" in output
    # the quick run's step ran, the slow run's never did; no lock is left behind
    assert bed["lock1"].run(f"cat {marks}").stdout.split() == ["quick"]
    assert not lock_exists(bed)
    after = run_pyinfra(bed.inventory, "--data", f"lock_write={marks}:after", deploy=DEPLOY, timeout=120)
    assert after.returncode == 0 and "recovered a stale lock" not in after.output, after.output[-3000:]
    assert bed["lock1"].run(f"cat {marks}").stdout.split() == ["quick", "after"]
