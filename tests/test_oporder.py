"""operations/oporder.py against pyinfra 3.10's own get_operation_order_from_stack, on real stacks:
the same line numbers from the same frames, only without reading the source."""

from __future__ import annotations

import pyinfra
import pyinfra.api.util as pyinfra_util
import pytest

from operations import oporder
from operations.oporder import pyinfra_operation


class State:
    def __init__(self, deploy_filename):
        self.current_deploy_filename = deploy_filename
        self.current_op_file_number = 3


def both(state):
    # called from the same frame, so each sees the same stack above this one
    return oporder.order_from_stack(state), pyinfra_util.get_operation_order_from_stack(state)


def nested(depth, state):
    if depth:
        return nested(depth - 1, state)
    return both(state)


def spread_over_lines(state):
    return [
        value
        for value in [
            nested(
                2,
                state,
            )
        ]
    ][0]


def from_a_generator(state):
    yield both(state)


@pytest.fixture(params=[True, False], ids=["cli", "api"])
def cli_mode(request, monkeypatch):
    monkeypatch.setattr(pyinfra, "is_cli", request.param)
    return request.param


@pytest.mark.parametrize("deploy_file", [__file__, "/no/such/deploy.py", None])
def test_the_same_order_as_pyinfras_own(cli_mode, deploy_file):
    state = State(deploy_file)
    for ours, upstream in [both(state), nested(5, state), spread_over_lines(state), next(from_a_generator(state)),
                           (lambda: both(state))(), exec_both(state)]:
        assert ours == upstream
        numbered = [3] if cli_mode else []
        if deploy_file == "/no/such/deploy.py":
            assert ours == numbered  # no frame of the deploy file: only the operation file's number
        else:  # this file's frames, down to the call in both()
            assert len(ours) > len(numbered) + 1 and ours[:len(numbered)] == numbered


def exec_both(state):
    # deploy files are exec'd by pyinfra's CLI from their own code object (pyinfra_cli/util.py exec_file)
    scope = {"both": both, "state": state}
    exec(compile("result = both(state)\n", __file__, "exec"), scope)
    return scope["result"]


def test_activate_replaces_only_pyinfras_pinned_function(monkeypatch):
    monkeypatch.setattr(pyinfra_operation, "get_operation_order_from_stack", pyinfra_util.get_operation_order_from_stack)
    assert oporder.activate() is True
    assert pyinfra_operation.get_operation_order_from_stack is oporder.order_from_stack
    # another pyinfra's function (different code): left alone
    def changed(state):
        return [1]

    monkeypatch.setattr(pyinfra_operation, "get_operation_order_from_stack", changed)
    monkeypatch.setattr(pyinfra_util, "get_operation_order_from_stack", changed)
    assert oporder.activate() is False
    assert pyinfra_operation.get_operation_order_from_stack is changed
