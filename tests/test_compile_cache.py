"""vLLM's torch.compile cache across releases: the name vLLM is started with (resolve/launcher.py model_key).

vLLM 0.26.0 keys its compile cache on ModelConfig's fields, ``model`` (the path it is given) among them, not on
config.json's content: a path naming the release misses the cache on every release (measured on an H100,
docs/gpu-proof.md "Restarts"); one name for every release would load another config's graph."""

from __future__ import annotations

import json

from resolve.launcher import model_key, model_link
from resolve.plan import make_plan
from tests.test_planning import COMMIT, CONFIG, StandInHub, context, deployment_of, h200x8, index  # noqa: F401

CONFIG_TEXT = json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32})
SHARDS = {"model-00001-of-00002.safetensors": "a" * 64, "model-00002-of-00002.safetensors": "b" * 64,
          "model.safetensors.index.json": None, "README.md": None, "generation_config.json": None,
          "tokenizer.json": None, "tokenizer_config.json": None, "special_tokens_map.json": None}


def test_a_revision_that_changes_only_docs_tokenizer_sampling_or_weight_bytes_keeps_the_key():
    key = model_key("1" * 40, {"config.json": CONFIG_TEXT}, SHARDS)
    # another commit: README, generation_config.json and the weights' bytes changed (the Hub's sha256 of a shard)
    other = {**SHARDS, "model-00001-of-00002.safetensors": "c" * 64}
    assert model_key("2" * 40, {"config.json": CONFIG_TEXT}, other) == key
    assert model_link(key) == f"model-{key}" and len(key) == 16


def test_a_config_change_is_another_key():
    key = model_key("1" * 40, {"config.json": CONFIG_TEXT}, SHARDS)
    deeper = json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 33})
    assert model_key("1" * 40, {"config.json": deeper}, SHARDS) != key
    # a quantization config heavylift renders is keyed the same way
    assert model_key("1" * 40, {"config.json": CONFIG_TEXT, "hf_quant_config.json": "{}"}, SHARDS) != key


def test_a_file_the_hub_does_not_hash_puts_the_commit_into_the_key():
    """Remote code or another small config: its content is unknown at plan time, so another revision is
    another key (never a stale graph), while LFS files are keyed by their sha256."""
    code = {**SHARDS, "modeling_custom.py": None}
    assert model_key("1" * 40, {"config.json": CONFIG_TEXT}, code) != model_key("2" * 40, {"config.json": CONFIG_TEXT}, code)
    gguf = {"model.gguf": "d" * 64}
    assert model_key("1" * 40, {}, gguf) == model_key("2" * 40, {}, gguf)
    assert model_key("1" * 40, {}, gguf) != model_key("1" * 40, {}, {"model.gguf": "e" * 64})


class NewReadme(StandInHub):
    """The same checkpoint at another commit whose only change is a README."""

    def commit(self, repo, revision):
        return "f" * 40

    def files(self, repo, commit):
        return [*super().files(repo, commit), type(super().files(repo, commit)[0])("README.md", 10, None)]


def test_the_launcher_starts_vllm_with_the_releases_model_link(tmp_path, index):  # noqa: F811
    vllm = {"version": "0.34.0", "index_url": f"{index.url}/pypi/"}
    plan = make_plan(deployment_of(tmp_path, vllm=vllm), "gpu1", h200x8(), context=context(tmp_path), hub=StandInHub())
    link = plan.release.model_link
    assert link.startswith("model-")
    # relative: the launcher cds into its release folder, where the link points at that release's overlay
    assert f" {link} " in plan.release.launcher_text.replace("\\\n    ", " ")
    assert '"$HERE"/overlay' not in plan.release.launcher_text
    # a README-only revision: another release (its overlay links the new snapshot), the same name for vLLM
    other = tmp_path / "other"  # a site of its own: the first plan's lock file pins its commit
    other.mkdir()
    again = make_plan(deployment_of(other, vllm=vllm), "gpu1", h200x8(), context=context(other), hub=NewReadme())
    assert again.weights.snapshot.commit != plan.weights.snapshot.commit
    assert again.release.id != plan.release.id
    assert again.release.model_link == link
