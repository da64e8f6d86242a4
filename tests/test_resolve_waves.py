"""resolve/waves.py: the waves from the site's settings (wave_size, max_unavailable), cut per deployment in inventory
order, and the settings refused before any host changes."""

from types import SimpleNamespace

import pytest

from resolve import waves


def fleet(names, deployment="kimi", **settings):
    values = {"wave_size": None, "max_unavailable": None, "root": "/opt/heavylift", **settings}
    return {name: SimpleNamespace(name=deployment, settings=SimpleNamespace(**values)) for name in names}


@pytest.mark.parametrize("settings, expected", [
    ({}, [["h1", "h2", "h3", "h4", "h5"]]),
    ({"wave_size": 2}, [["h1", "h2"], ["h3", "h4"], ["h5"]]),
    ({"max_unavailable": 1}, [["h1"], ["h2"], ["h3"], ["h4"], ["h5"]]),
    ({"max_unavailable": "40%"}, [["h1", "h2"], ["h3", "h4"], ["h5"]]),  # 5 x 40% = 2
    ({"max_unavailable": "10%"}, [["h1"], ["h2"], ["h3"], ["h4"], ["h5"]]),  # 0.5 rounds down, to at least 1
])
def test_waves_cut_each_deployment_in_inventory_order(settings, expected):
    names = ["h1", "h2", "h3", "h4", "h5"]
    plan = waves.plan_waves(fleet(names, **settings), names)
    assert [list(wave) for wave in plan.waves] == expected
    assert plan.rolling == bool(settings)


def test_two_deployments_roll_side_by_side():
    deployments = {**fleet(["a1", "a2", "a3"], "a", wave_size=1), **fleet(["b1", "b2"], "b", wave_size=2)}
    plan = waves.plan_waves(deployments, ["a1", "b1", "a2", "b2", "a3"])
    assert [list(w) for w in plan.waves] == [["a1", "b1", "b2"], ["a2"], ["a3"]]
    assert plan.per_wave == {"a": 1, "b": 2}


def test_hosts_of_one_deployment_that_disagree_are_refused_naming_both_files():
    from models.errors import HeavyliftConfigError

    deployments = {**fleet(["h1"], wave_size=1), **fleet(["h2"], wave_size=2)}
    with pytest.raises(HeavyliftConfigError) as refused:
        waves.plan_waves(deployments, ["h1", "h2"], origin=lambda name, key: f"group_data/{name}.py")
    text = str(refused.value)
    assert text.startswith("group_data/h2.py, host 'h2': field 'wave_size' is 2 here but 1 for host 'h1' (group_data/h1.py)")
    assert "Fix: set wave_size once" in text and text.endswith("No host was changed.")


def test_a_wave_setting_on_a_multi_node_deployment_is_refused():
    """A multi-node group is one vLLM instance: cut into waves, a node would restart without its peers."""
    from models.errors import HeavyliftConfigError

    deployments = fleet(["n0", "n1"], wave_size=1, multinode=SimpleNamespace(node_rank=0))
    with pytest.raises(HeavyliftConfigError) as refused:
        waves.plan_waves(deployments, ["n0", "n1"], origin=lambda name, key: "group_data/nodes.py")
    text = str(refused.value)
    assert text.startswith("group_data/nodes.py, host 'n0': field 'wave_size' is set for the multi-node deployment 'kimi'")
    assert "remove the wave setting" in text and text.endswith("No host was changed.")
    # without a wave setting the group is one unit of the run, as any deployment rolled all at once
    assert waves.plan_waves(fleet(["n0", "n1"], multinode=SimpleNamespace(node_rank=0)), ["n0", "n1"]).waves == (("n0", "n1"),)
