"""operations/diskgc.py: the commands that remove what resolve/diskgc.py planned (tests/test_resolve_diskgc.py): the
releases first, then each manifest before its files; nothing to remove is a noop that says what stays."""

from operations import diskgc
from pyinfra_fixtures import run_operation
from resolve.diskgc import plan_snapshots
from test_resolve_diskgc import ROOT, snap, state


def test_pruning_removes_the_releases_first_then_each_manifest_before_its_files():
    plan = plan_snapshots(state(), "tiny", snap("4")["path"], keep=0)
    commands, host = run_operation(diskgc.snapshots_pruned, {"plan": plan}, {})
    gone = snap("1")["path"]
    assert commands == [
        f"rm -rf {ROOT}/deployments/tiny/releases/r1aaaaaaaaaaa",
        f"rm -f {gone}.manifest.json",
        f"rm -rf {gone}.manifest.*",
        f"rm -rf {gone}",
    ]
    assert host.noops == []


def test_nothing_to_prune_is_a_noop_that_says_what_stays():
    plan = plan_snapshots(state(), "tiny", snap("4")["path"], keep=4)
    commands, host = run_operation(diskgc.snapshots_pruned, {"plan": plan}, {})
    assert commands == [] and host.noops == ["5 snapshots kept, none to remove"]
