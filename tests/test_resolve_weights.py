"""resolve/weights.py: the weights plan of one host from the snapshot and the host's facts (the manifest's view of
the content folder, the free space), its plan line and its disk check."""

import pytest

from resolve.hub import HubFile, Snapshot
from resolve.weights import WeightsPlan, plan_weights


def test_plan_line_names_resumed_and_stale_partial_bytes():
    plan = WeightsPlan(label="org/m@0123456789ab", to_fetch=("a", "b"), fetch_bytes=2 * 10**9, to_verify=(),
                       up_to_date=False, free={"path": "/r", "free_bytes": 10**9, "total_bytes": 10**12},
                       margin_bytes=0, resume_bytes=3 * 10**9, stale_bytes=4 * 10**9)
    assert plan.summary() == ("2 files, 2.0 GB to fetch (3.0 GB more resumed from partial files), 4.0 GB of a dead "
                              "run's partial files to remove, 0 files to re-verify, 3.0 GB free after on /r")
    plan.check_fits()  # 2 GB fit 1 GB free + 4 GB freed


def test_weights_preflight_counts_the_freed_bytes():
    tight = dict(label="r@c", to_fetch=("a",), fetch_bytes=10_000, to_verify=(), up_to_date=False,
                 free={"path": "/opt", "free_bytes": 6_000, "total_bytes": 1e6}, margin_bytes=1_000)
    with pytest.raises(Exception, match=r"10.0 kB still to download but /opt has 6.0 kB free \+ 4.0 kB from old snapshots"):
        WeightsPlan(**tight, freed_bytes=4_000).check_fits()
    WeightsPlan(**tight, freed_bytes=5_000).check_fits()
    assert "counting 5.0 kB of old snapshots removed first" in WeightsPlan(**tight, freed_bytes=5_000).summary()


def test_the_plan_from_the_facts_fetches_wrong_sizes_and_verifies_what_the_manifest_does_not_vouch_for():
    snapshot = Snapshot("org/m", "0123456789abcdef0123456789abcdef01234567",
                        (HubFile("a", 3 * 10**9, None), HubFile("b", 10**9, None), HubFile("c", 10, None)))
    found = {"state": "changed", "files": ["a", "b", "c"], "changed": ["b"], "present": {"a": 3 * 10**9, "b": 10**9}}
    free = {"path": "/r", "free_bytes": 30 * 10**9, "total_bytes": 10**12}
    plan = plan_weights(snapshot, found, free, disk_margin_gb=1, freed_bytes=10**9)
    assert (plan.label, plan.to_fetch, plan.fetch_bytes, plan.to_verify, plan.up_to_date) == (
        "org/m@0123456789ab", ("c",), 10, ("b",), False)
    assert (plan.margin_bytes, plan.free_bytes) == (10**9, 31 * 10**9)
    assert plan_weights(snapshot, found, free, verify="full").to_verify == ("a", "b")
    # without a manifest every present file of the right size is hashed again
    assert plan_weights(snapshot, {"state": "absent", "present": found["present"]}, None).to_verify == ("a", "b")
