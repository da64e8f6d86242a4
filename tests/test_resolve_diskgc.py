"""resolve/diskgc.py: which weight snapshots a deploy removes: never one a kept release, another deployment or a
resumable download needs; the staging overlay's snapshot stays until the switch."""

from resolve import diskgc

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
