"""models/validate.py's keeping of a run's validation: every active host validated once per run, kept on the run's
own object (pyinfra's State, or the inventory where there is none), never in a module global; two runs in one
process each keep their own. What is refused and how it is worded: tests/test_bad_inputs.py."""

from __future__ import annotations

import pyinfra
import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_host, ctx_state

from models import validate
from models.errors import HeavyliftConfigError
from models.validate import DataSources, load_deployment, run_of, validated_deployments
from resolve import nodes

SITE = {"model": "tiny-llama", "hf_endpoint": "http://hub.invalid", "vllm": {"version": "0.34.0"}}


def site_run(port: int, with_state: bool = True) -> Inventory:
    """Two hosts serving on ``port``: in a State (their connections opened) or a bare inventory (API use)."""
    inventory = Inventory(([("gpu1", {**SITE, "port": port}), ("gpu2", {**SITE, "port": port})], {}))
    if with_state:
        state = State(inventory, Config())
        for host in inventory:
            state.activate_host(host)
    return inventory


def load(inventory: Inventory, name: str, tmp_path):
    return load_deployment(inventory.get_host(name), sources=DataSources.for_inventory(None, cwd=tmp_path))


def test_a_run_keeps_its_validation_on_its_state(tmp_path):
    first = site_run(8001)
    deployment = load(first, "gpu1", tmp_path)
    assert deployment.settings.port == 8001
    assert load(first, "gpu1", tmp_path) is deployment  # every active host validated once, for the run
    assert validated_deployments(first.get_host("gpu2")) == {"gpu1": deployment, "gpu2": load(first, "gpu2", tmp_path)}
    assert run_of(first.get_host("gpu1")) is first.state
    assert list(vars(first.state)[validate.RESULTS_ATTRIBUTE].values())[0][0]["gpu1"] is deployment
    assert validate.RESULTS_ATTRIBUTE not in vars(first) and not hasattr(validate, "_RESULTS")
    # a second run in the same process, the same host names: its own validation
    second = site_run(8002)
    assert load(second, "gpu1", tmp_path).settings.port == 8002
    assert validated_deployments(second.get_host("gpu2"))["gpu1"].settings.port == 8002
    assert validated_deployments(first.get_host("gpu2"))["gpu1"] is deployment


def test_an_inventory_without_a_state_keeps_its_validation_itself(tmp_path):
    """API use and tests: no State, no active hosts; each host is validated alone (as before), kept on the inventory."""
    inventory = site_run(8001, with_state=False)
    deployment = load(inventory, "gpu1", tmp_path)
    assert load(inventory, "gpu1", tmp_path) is deployment
    assert run_of(inventory.get_host("gpu1")) is inventory
    assert list(vars(inventory)[validate.RESULTS_ATTRIBUTE].values())[0][0] == {"gpu1": deployment}
    assert load(site_run(8002, with_state=False), "gpu1", tmp_path).settings.port == 8002


def test_the_run_of_pyinfras_context_host_is_its_state():
    inventory = site_run(8001)
    host = inventory.get_host("gpu2")
    with ctx_state.use(inventory.state), ctx_host.use(host):
        assert run_of(pyinfra.host) is inventory.state  # the proxy's host, the State object itself
    # resolve/nodes.py keeps its group plan on the same object
    assert nodes.run_of is run_of


def test_the_keys_an_entry_point_takes_are_an_input_of_each_validation(tmp_path):
    """``command_keys``: an entry point's own options (rollback.py's ``release``) are left out of the site's data for
    that call alone; the same run validated without them (deploy.py) refuses the key, kept apart by the keys, and no
    module state is changed."""
    inventory = Inventory(([("gpu1", {**SITE, "release": "r0"})], {}))
    host = inventory.get_host("gpu1")
    sources = DataSources.for_inventory(None, cwd=tmp_path)
    taken = load_deployment(host, sources=sources, command_keys=frozenset({"release"}))
    assert taken.name == "tiny-llama" and load_deployment(host, sources=sources, command_keys=["release"]) is taken
    with pytest.raises(HeavyliftConfigError, match=r"unknown key 'release'"):
        load_deployment(host, sources=sources)
    catalog = str(validate.catalog_folder().resolve())
    assert set(vars(inventory)[validate.RESULTS_ATTRIBUTE]) == {(catalog, frozenset()), (catalog, frozenset({"release"}))}
    assert not hasattr(validate, "COMMAND_KEYS")
    assert "release" in validate.heavylift_data(host) and "release" not in validate.heavylift_data(host, {"release"})
