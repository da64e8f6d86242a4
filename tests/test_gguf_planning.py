"""Planning a GGUF entry through the real path (catalog entry, site data, a real Hub mirror, a wheel
index stand-in): the rules read the base model's config.json (the repo the entry names as
--tokenizer), since a GGUF repository has none.

The seed rollout's GLM-5 GGUF on 8x RTX PRO 6000: with the catalog's hand-written refusal removed,
planning must still refuse, through the rules that know the architecture (GGUF loader without
glm_moe_dsa, sparse MLA on SM120 with --dtype float16), not plan with exit 0.
"""

import json
import shutil
from pathlib import Path

import pytest
from pyinfra.api import Inventory

from models.validate import DataSources, load_deployment
from operations.gpu import NvidiaGpus
from resolve.plan import RefusedError, make_plan
from testbed.hub_mirror import HubMirror, publish_repo
from testbed.wheel_index import WheelIndex

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
GGUF_REPO, BASE_REPO = "heavylift/glm5-like-gguf", "heavylift/glm5-like-base"


def gpus(case: str):
    return NvidiaGpus().process(json.loads((FIXTURES / "nvidia-smi" / f"{case}.json").read_text())["fact_output"])


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A GGUF repository (shards and a side file, no config.json) and its base repository (config.json)."""
    base = tmp_path_factory.mktemp("gguf-hub")
    gguf = base / "gguf"
    (gguf / "Q4_K_M").mkdir(parents=True)
    for n in (1, 2):
        (gguf / "Q4_K_M" / f"GLM-5-Q4_K_M-0000{n}-of-00002.gguf").write_bytes(b"GGUF" + bytes(64))
    (gguf / "params.json").write_text("{}\n")
    model = base / "base"
    model.mkdir()
    shutil.copy(FIXTURES / "configs" / "glm-5.config.json", model / "config.json")
    mirror_dir = base / "mirror"
    publish_repo(mirror_dir, GGUF_REPO, gguf)
    publish_repo(mirror_dir, BASE_REPO, model)
    with HubMirror(mirror_dir) as mirror:
        yield mirror


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    with WheelIndex(tmp_path_factory.mktemp("gguf-wheels")) as idx:
        for version in ("0.16.0", "0.26.0"):
            idx.add_pypi("vllm", version)
        yield idx


@pytest.fixture
def catalog(tmp_path):
    """The catalog with a GLM-5-like GGUF entry: models/glm-5.yaml on the mirror's repos, its refusal removed."""
    folder = tmp_path / "catalog"
    shutil.copytree(REPO_ROOT / "models", folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    text = (folder / "glm-5.yaml").read_text()
    text = text.replace("unsloth/GLM-5-GGUF", GGUF_REPO).replace("zai-org/GLM-5", BASE_REPO)
    # the hand-written refusal and the patch series (checked against a real wheel) go
    text = text.split("\nvllm_patches:")[0] + "\n"
    assert "support:" not in text and BASE_REPO in text
    (folder / "glm5-like.yaml").write_text(text)
    return folder


def plan_for(catalog, tmp_path, monkeypatch, hub, index, version, host_gpus):
    monkeypatch.setenv("HEAVYLIFT_LOCK_FILE", str(tmp_path / "site.lock.json"))
    data = {"model": "glm5-like", "hf_endpoint": hub.url, "vllm": {"version": version, "index_url": f"{index.url}/pypi/"}}
    inventory = Inventory(([("gpu1", data)], {}))
    deployment = load_deployment(
        inventory.get_host("gpu1"), catalog_dir=catalog, sources=DataSources.for_inventory(None, cwd=tmp_path)
    )
    return make_plan(deployment, "gpu1", host_gpus)


@pytest.mark.parametrize("version", ["0.16.0", "0.26.0"])
def test_gguf_rules_see_the_base_models_architecture(catalog, tmp_path, monkeypatch, hub, index, version):
    with pytest.raises(RefusedError) as refused:
        plan_for(catalog, tmp_path, monkeypatch, hub, index, version, gpus("rtx-pro-6000-x8"))
    resolution = refused.value.resolution
    fired = set(resolution.fired_ids())
    # the GGUF loader knows no glm_moe_dsa: the architecture came from the base repo's config.json
    assert "rule gguf-unknown-model-type: vLLM's GGUF loader does not know model_type glm_moe_dsa" in str(refused.value)
    assert "gguf-unknown-model-type" in fired
    # and the sparse MLA (DSA indexer) rules see an SM120 host
    if version == "0.16.0":
        assert "sparse-mla-sm12x-none" in fired, fired
    else:
        assert {"sparse-mla-sm12x-dtype", "sparse-mla-sm12x-backend"} <= fired, fired
    # the base repo's head is pinned in the lock file beside the checkpoint's
    lock = json.loads((tmp_path / "site.lock.json").read_text())["resolved"]
    assert any(key.endswith(f"{BASE_REPO}@main") for key in lock), lock
