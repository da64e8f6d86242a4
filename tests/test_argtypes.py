"""operations/argtypes.py against pyinfra 3.10's own all_global_arguments: the same pairs, computed once."""

from __future__ import annotations

import pyinfra.api.arguments as pyinfra_arguments
import pyinfra.api.facts as pyinfra_facts
from pyinfra.api import Config, Inventory, State

from operations import argtypes


def test_the_same_pairs_as_pyinfras_own():
    ours = argtypes.cached_global_arguments()
    assert ours == argtypes._upstream()
    assert {"_sudo", "_env", "_if", "_shell_executable"} <= {name for name, _ in ours}
    # a new list each call, as upstream's: a caller changing it changes no later call
    ours.clear()
    assert argtypes.cached_global_arguments() == argtypes._upstream()


def test_pop_global_arguments_unchanged(monkeypatch):
    inventory = Inventory((["somehost"], {}))
    state = State(inventory, Config())
    host = inventory.get_host("somehost")
    kwargs = {"_sudo": True, "_env": {"A": "1"}, "path": "/tmp"}
    monkeypatch.setattr(pyinfra_arguments, "all_global_arguments", argtypes._upstream)
    upstream = pyinfra_arguments.pop_global_arguments(state, host, dict(kwargs))
    monkeypatch.setattr(pyinfra_arguments, "all_global_arguments", argtypes.cached_global_arguments)
    assert pyinfra_arguments.pop_global_arguments(state, host, dict(kwargs)) == upstream
    assert upstream[0]["_sudo"] is True and upstream[1] == ["_sudo", "_env"]


def test_activate_replaces_only_pyinfras_pinned_function(monkeypatch):
    monkeypatch.setattr(pyinfra_arguments, "all_global_arguments", argtypes._upstream)
    monkeypatch.setattr(pyinfra_facts, "all_global_arguments", argtypes._upstream)
    assert argtypes.activate() is True
    assert pyinfra_arguments.all_global_arguments is argtypes.cached_global_arguments
    assert pyinfra_facts.all_global_arguments is argtypes.cached_global_arguments

    def changed():  # another pyinfra's function (different code): left alone
        return []

    monkeypatch.setattr(pyinfra_arguments, "all_global_arguments", changed)
    monkeypatch.setattr(pyinfra_facts, "all_global_arguments", changed)
    monkeypatch.setattr(argtypes, "_upstream", changed)
    assert argtypes.activate() is False
    assert pyinfra_arguments.all_global_arguments is changed
