"""deploy.py, rollback.py and retire.py in a real pyinfra state, as its CLI prepares them: each file run on every
host with pyinfra's CLI operation order (operations/oporder.py: the line numbers of the calls that added an
operation), planning replaced by stand-ins. Each takes the host lock before its first operation and gives it
back as its last (hostlock.with_lock), also in a dry run, and calls its stages in order."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pyinfra
import pyinfra.api.util as pyinfra_util
import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state
from pyinfra.operations import server

from models import validate
from models.errors import HeavyliftConfigError
from operations import argtypes, factbatch, fleet, hostlock, retire, rollback, rollout, waves
from operations.oporder import pyinfra_operation
from resolve.layout import Layout
from resolve.plan import GatePart, SwitchPart, service_part
from resolve.retire import RetirePlan
from resolve.rollback import RollbackPlan
from resolve.waves import plan_waves

REPO_ROOT = Path(__file__).resolve().parent.parent
GIVEN_BACK = "deploy lock given back"
LOCK = "/opt/heavylift/deploy.lock"


@pytest.fixture
def cli(monkeypatch):
    """pyinfra's CLI mode, its operation order restored after the test (the entry points activate ours)."""
    monkeypatch.setattr(pyinfra, "is_cli", True)
    monkeypatch.setattr(pyinfra_operation, "get_operation_order_from_stack",
                        pyinfra_util.get_operation_order_from_stack)
    monkeypatch.setattr(factbatch, "activate", lambda host: None)
    monkeypatch.setattr(argtypes, "activate", lambda: True)
    taken = []
    monkeypatch.setattr(hostlock, "hold", lambda host, state, path, dry=False: taken.append(
        (host.name, path, dry, len(host.op_hash_order))))
    return taken


def prepared(deploy_file: str, hosts=("h1", "h2")) -> State:
    """``deploy_file`` run on every host as pyinfra's CLI prepares a deploy (pyinfra_cli/util.py load_deploy_file)."""
    state = State(Inventory((list(hosts), {})), Config())
    state.check_for_changes = False  # no operation runs its commands: none needs a fact of a host
    state.set_stage(StateStage.Prepare)
    path = str(REPO_ROOT / deploy_file)
    state.current_deploy_filename = path
    code = compile(Path(path).read_text(), path, "exec")
    for host in state.inventory:
        with ctx_state.use(state), ctx_host.use(host):
            exec(code, {"__file__": path, "__name__": "__main__"})
    return state


def names(state: State, op_hashes) -> list[str]:
    return [" / ".join(sorted(state.get_op_meta(op_hash).names)) for op_hash in op_hashes]


def assert_lock_around(state: State, taken: list, dry: bool) -> list[str]:
    """The lock held on every host before its first operation, given back as every host's last operation, whichever
    way pyinfra breaks ties (the line numbers of the calls): returns the operations in between."""
    assert taken == [(host.name, LOCK, dry, 0) for host in state.inventory]
    order = names(state, state.get_op_order())
    assert order[-1] == GIVEN_BACK and order.count(GIVEN_BACK) == 1
    for host in state.inventory:
        assert names(state, host.op_hash_order)[-1] == GIVEN_BACK
    # pyinfra sorts operations that are ready together by those line numbers: the lock's is the largest
    by_lines = sorted(state.op_meta, key=lambda op_hash: state.get_op_meta(op_hash).op_order)
    assert names(state, by_lines)[-1] == GIVEN_BACK
    return order[:-1]


def stage(label, result=None):
    """A stand-in stage: one operation named ``label``."""
    def run(*args, **kwargs):
        server.shell(name=label, commands=["true"])
        return result() if callable(result) else result
    return run


# deploy.py's stages (operations/rollout.py), each replaced by one stand-in operation: (function, its label, what
# it returns)
DEPLOY_STAGES = [
    ("runtime_converged", "runtime", list), ("weights_present", "weights", (None, None)),
    ("overlay_rendered", "overlay", list), ("release_staged", "release", list), ("readable", "readable", None),
    ("release_switched", "switch", None), ("service_running", "service", (None, None)),
    ("gate_passed", "gate", dict), ("wave_rolled_back", "wave rollback", None),
]


@pytest.mark.parametrize("dry", [False, True], ids=["run", "dry"])
@pytest.mark.parametrize("wave_size", [None, 1], ids=["all-at-once", "waves"])
def test_deploy_takes_the_lock_first_and_gives_it_back_last(cli, monkeypatch, dry, wave_size):
    plan = SimpleNamespace(layout=Layout.of_host(None).of("tiny"), until="serve")
    monkeypatch.setattr(rollout, "planned", lambda: (plan, SimpleNamespace(dry=dry)))
    deployment = SimpleNamespace(name="tiny", settings=SimpleNamespace(wave_size=wave_size, max_unavailable=None,
                                                                       root="/opt/heavylift"))
    monkeypatch.setattr(waves, "planned", lambda host, context: plan_waves(
        {"h1": deployment, "h2": deployment}, ["h1", "h2"]))
    monkeypatch.setattr(rollout, "report_resolution", lambda plan: None)
    monkeypatch.setattr(rollout, "disk_checked", lambda plan: SimpleNamespace(refusal=None))
    for name, label, result in DEPLOY_STAGES:
        monkeypatch.setattr(rollout, name, stage(label, result))

    state = prepared("deploy.py")
    stages = ["switch", "service", "gate", "wave rollback"]
    expected = ["runtime", "weights", "overlay", "release", "readable"] + (
        ["wave 1 of 2 (h1) starts", *stages, "wave 2 of 2 (h2) starts", *stages, "rollout summary (which hosts run what)"]
        if wave_size else stages)
    assert assert_lock_around(state, cli, dry) == expected


def test_deploy_until_prepare_stops_before_the_switch_and_still_gives_the_lock_back(cli, monkeypatch):
    plan = SimpleNamespace(layout=Layout.of_host(None).of("tiny"), until="prepare")
    monkeypatch.setattr(rollout, "planned", lambda: (plan, SimpleNamespace(dry=False)))
    monkeypatch.setattr(waves, "planned", lambda host, context: plan_waves({}, []))
    monkeypatch.setattr(rollout, "report_resolution", lambda plan: None)
    monkeypatch.setattr(rollout, "disk_checked", lambda plan: SimpleNamespace(refusal=None))
    for name, label, result in [
        ("runtime_converged", "runtime", list), ("weights_present", "weights", (None, None)),
        ("overlay_rendered", "overlay", list), ("release_staged", "release", list), ("readable", "readable", None),
        ("release_switched", "switch", None),
    ]:
        monkeypatch.setattr(rollout, name, stage(label, result))
    state = prepared("deploy.py")
    assert assert_lock_around(state, cli, False) == ["runtime", "weights", "overlay", "release", "readable"]


@pytest.mark.parametrize("when", ["hold", "proceed"])
def test_deploy_with_a_disk_too_small_on_one_host_holds_the_run_or_leaves_that_host_out(cli, monkeypatch, when):
    """when_disk_too_small: hold ends the run while it is prepared, before any host has an operation; proceed gives
    the refused host one operation, the one that fails it, and no lock, while the other host rolls out."""
    from operations import weights
    from pyinfra.api import OperationError

    plan = SimpleNamespace(layout=Layout.of_host(None).of("tiny"), until="serve",
                           weights=SimpleNamespace(when_too_small=when))
    monkeypatch.setattr(rollout, "planned", lambda: (plan, SimpleNamespace(dry=False)))
    monkeypatch.setattr(waves, "planned", lambda host, context: plan_waves({}, []))
    monkeypatch.setattr(rollout, "report_resolution", lambda plan: None)
    why = "h2: heavylift/tiny@0123456789ab: 5.0 MB still to download but /opt/heavylift/models has 1.0 MB free (margin 0 GB)."
    monkeypatch.setattr(rollout, "disk_checked", lambda plan: SimpleNamespace(
        refusal=why if pyinfra.host.name == "h2" else None))
    for name, label, result in DEPLOY_STAGES:
        monkeypatch.setattr(rollout, name, stage(label, result))
    if when == "hold":
        with pytest.raises(OperationError, match="set when_disk_too_small: proceed .* No host was changed"):
            prepared("deploy.py")
        return
    state = prepared("deploy.py")
    h1, h2 = state.inventory.get_host("h1"), state.inventory.get_host("h2")
    assert names(state, h2.op_hash_order) == ["disk too small for the checkpoint: host left untouched"]
    assert [entry[0] for entry in cli] == ["h1"]  # only the host that changes takes its lock
    assert names(state, h1.op_hash_order)[0] == "runtime" and names(state, h1.op_hash_order)[-1] == GIVEN_BACK
    assert weights.refused  # the operation a refused host gets (its cases: tests/operations/weights.refused)


def test_with_lock_gives_back_after_the_steps_where_a_with_block_would_not(cli):
    """Why hostlock.with_lock is a call: the exit of a ``with`` block counts as the block's first line, so an
    operation added there would carry a smaller order than the block's own (pyinfra breaks ties by it)."""
    lines = {}

    class Block:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            lines["exit"] = sys._getframe(1).f_lineno

    def block():
        with Block():
            lines["body"] = sys._getframe(0).f_lineno

    block()
    assert lines["exit"] < lines["body"]


def host_with(data: dict, host_state: dict):
    """A host of an inventory whose HostState fact is ``host_state``, put in pyinfra's context with its state."""
    inventory = Inventory((["h1"], data))
    state = State(inventory, Config())
    host = inventory.get_host("h1")
    host.get_fact = lambda fact, **kwargs: host_state if fact is fleet.HostState else "systemd"
    return ctx_state.use(state), ctx_host.use(host)


# --- rollback.py


def rollback_plan(manager="systemd") -> RollbackPlan:
    settings = SimpleNamespace(service_manager=manager, service_user="vllm", start_timeout=None, readiness_timeout=600,
                               shutdown_timeout=30, restart_delay=5, restart_max_delay=60, limit_nofile=65536)
    return RollbackPlan(
        deployment="tiny", layout=Layout.of_host(None).of("tiny"), was="r2", target={"id": "r1", "model": "m", "vllm": "v"},
        switch=SwitchPart(release="r1", keep=5, label="current release r1 (rollback)"),
        service=service_part(settings, None, restart_only=True),
        gate=GatePart(url="http://127.0.0.1:8000", model="m", endpoint="http://h1:8000/v1", budget_seconds=600,
                      benchmark_tokens=16, meta={}),
    )


@pytest.mark.parametrize("dry", [False, True], ids=["run", "dry"])
@pytest.mark.parametrize("manager", ["systemd", "fallback"])
def test_rollback_is_the_switch_service_and_gate_stages_under_the_lock(cli, monkeypatch, dry, manager):
    monkeypatch.setattr(rollback, "planned", lambda: (rollback_plan(manager), SimpleNamespace(dry=dry)))
    state = prepared("rollback.py")
    assert assert_lock_around(state, cli, dry) == [
        "current release r1 (rollback)", f"service restart ({manager})", "vLLM ready"]


def test_rollback_refuses_when_there_is_no_release_to_go_back_to_before_any_change():
    site = {"model": "tiny-llama", "hf_endpoint": "http://hub.invalid", "vllm": {"version": "0.34.0"}}
    kept = {"id": "r1", "model": "m", "vllm": "v", "host": None, "port": None, "served_model_name": None}
    on_host = {"root": "/opt/heavylift",
               "deployments": {"tiny-llama": {"current": "r1", "previous": None, "releases": [kept]}}}
    state_context, host_context = host_with(site, on_host)
    with state_context, host_context, pytest.raises(HeavyliftConfigError) as refused:
        rollback.planned()
    assert str(refused.value) == (
        "rollback.py, host 'h1': deployment 'tiny-llama' has no previous release to go back to (current r1, previous "
        "none); it keeps releases r1 (m, v, current). Fix: name one with --data release=<id>. No host was changed.")
    on_host["deployments"]["tiny-llama"].update(previous="r0", releases=[kept, {**kept, "id": "r0"}])
    state_context, host_context = host_with(site, on_host)
    with state_context, host_context:
        plan, context = rollback.planned()
    # service_manager auto: decided by the host's init system as a deploy's planning decides it
    assert (plan.switch.release, plan.was, plan.service.manager, context.dry) == ("r0", "r1", "systemd", False)


def test_a_rollback_leaves_its_option_to_itself_for_a_deploy_in_the_same_process(tmp_path):
    """rollback.py takes ``--data release=<id>``; a deploy's validation afterwards in the same process, of the same
    run's objects or of another run, still refuses it as an unknown key: the keys an entry point takes are an input
    of its validation (``command_keys``), not module state a rollback leaves changed."""
    site = {"model": "tiny-llama", "hf_endpoint": "http://hub.invalid", "vllm": {"version": "0.34.0"}, "release": "r0"}
    kept = {"id": "r1", "model": "m", "vllm": "v", "host": None, "port": None, "served_model_name": None}
    on_host = {"root": "/opt/heavylift", "deployments": {"tiny-llama": {
        "current": "r1", "previous": "r0", "releases": [kept, {**kept, "id": "r0"}]}}}
    state_context, host_context = host_with(site, on_host)
    with state_context, host_context:
        plan, _ = rollback.planned()
        assert plan.switch.release == "r0"
        # deploy.py's validation (operations/rollout.py planned: no command keys) of the same run's host
        with pytest.raises(HeavyliftConfigError, match=r"unknown key 'release'"):
            validate.load_deployment(ctx_host.get())
    # and of another run's
    state_context, host_context = host_with(site, on_host)
    with state_context, host_context, pytest.raises(HeavyliftConfigError, match=r"unknown key 'release'"):
        validate.load_deployment(ctx_host.get())


# --- retire.py


@pytest.mark.parametrize("dry", [False, True], ids=["run", "dry"])
def test_retire_removes_under_the_lock(cli, monkeypatch, dry):
    layout = Layout.of_host(None).of("tiny")
    plan = RetirePlan("tiny", layout.deployment_dir, {"manager": "systemd"}, layout, user="vllm")
    monkeypatch.setattr(retire, "planned", lambda: (plan, SimpleNamespace(dry=dry)))
    state = prepared("retire.py")
    assert assert_lock_around(state, cli, dry) == ["retire deployment tiny"]


ON_HOST = {"root": "/opt/heavylift", "deployments": {"tiny": {"service": {"manager": "fallback", "state": "active"},
                                                             "releases": []}},
           "snapshots": []}


@pytest.mark.parametrize("name, message", [
    (None, "retire.py, host 'h1': field 'retire' (None) does not name a deployment. Fix: --data retire=<deployment "
           "name>, e.g. --data retire=kimi. No host was changed."),
    ("other", "retire.py, host 'h1': field 'retire': deployment 'other' is not on this host (under "
              "/opt/heavylift/deployments: tiny). Fix: name one of those, or leave this host out with --limit. "
              "No host was changed."),
])
def test_retire_refuses_a_deployment_the_host_does_not_have_before_any_change(name, message):
    state_context, host_context = host_with({"retire": name} if name else {}, ON_HOST)
    with state_context, host_context, pytest.raises(HeavyliftConfigError) as refused:
        retire.planned()
    assert str(refused.value) == message


def test_retire_plans_the_named_deployment_with_its_service_user():
    state_context, host_context = host_with({"retire": "tiny"}, ON_HOST)
    with state_context, host_context:
        plan, context = retire.planned()
    assert (plan.deployment, plan.user, plan.layout.lock, context.dry) == ("tiny", "heavylift", LOCK, False)
    state_context, host_context = host_with({"retire": "tiny", "service_user": "svc"}, ON_HOST)
    with state_context, host_context:
        assert retire.planned()[0].user == "svc"
