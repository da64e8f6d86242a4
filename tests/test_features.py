"""Model features from the catalog entry and the checkpoint's own config files."""

import json
from pathlib import Path

import pytest

from models.catalog import load_entry
from operations.checkpoint import apply_patch
from resolve.compat import STRIP_KV_CACHE_QUANT
from resolve.features import KV_CACHE_DECLARATIONS, config_repo, dotted_get, model_features, text_config
from testbed import tiny_model

CONFIGS = Path(__file__).parent / "fixtures" / "configs"


def config(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


@pytest.fixture(scope="module")
def kimi():
    return model_features(
        load_entry("kimi-k2.5-nvfp4"),
        config("kimi-k2.5-nvfp4.config.json"),
        config("kimi-k2.5-nvfp4.hf_quant_config.json"),
        weight_bytes=590 * 10**9,
    )


def test_kimi_reads_the_nested_text_config(kimi):
    assert kimi.model_type == "kimi_k25"
    assert kimi.text_model_type == "kimi_k2"
    assert kimi.attention == "mla"
    assert (kimi.kv_lora_rank, kimi.qk_nope_head_dim, kimi.qk_rope_head_dim) == (512, 128, 64)
    assert kimi.mla_latent_width == 576
    assert kimi.num_attention_heads == 64 and kimi.num_key_value_heads == 64
    assert kimi.num_hidden_layers == 61
    assert kimi.index_topk is None
    assert kimi.torch_dtype == "bfloat16"
    assert kimi.format == "safetensors" and kimi.gguf_model_type is None
    assert kimi.weight_bytes == 590 * 10**9
    assert kimi.configs_read == ("config.json", "hf_quant_config.json")


def test_kimi_kv_cache_and_weight_quantization_and_where_they_come_from(kimi):
    assert kimi.kv_cache_quant == "fp8"
    assert kimi.kv_cache_quant_sources == (
        "hf_quant_config.json: quantization.kv_cache_quant_algo = FP8",
        "config.json: quantization_config.kv_cache_scheme = {num_bits: 8, type: float}",
    )
    assert kimi.weight_quant == "nvfp4"
    assert kimi.weight_quant_source == "hf_quant_config.json: quantization.quant_algo = NVFP4"


def test_glm5_gguf_is_sparse_mla_with_the_dsa_indexer():
    entry = load_entry("glm-5")
    assert config_repo(entry) == "zai-org/GLM-5"  # the base repo named as --tokenizer
    features = model_features(entry, config("glm-5.config.json"), None, weight_bytes=400 * 10**9)
    assert features.format == "gguf"
    assert features.attention == "sparse_mla"
    assert features.qk_nope_head_dim == 192
    assert (features.index_topk, features.index_n_heads, features.index_head_dim) == (2048, 32, 128)
    assert features.gguf_model_type == "glm_moe_dsa"
    assert features.weight_quant == "gguf"
    assert features.kv_cache_quant is None and features.kv_cache_quant_sources == ()


def test_sparse_by_model_type_even_without_index_keys():
    raw = config("glm-5.config.json")
    for key in ("index_topk", "index_n_heads", "index_head_dim"):
        raw.pop(key)
    assert model_features(load_entry("glm-5"), raw).attention == "sparse_mla"
    raw["model_type"] = "deepseek_v3"
    assert model_features(load_entry("glm-5"), raw).attention == "mla"


def test_tiny_mla_carries_kimis_kv_cache_declarations():
    features = model_features(load_entry("tiny-mla"), tiny_model.mla_config({}, True), tiny_model.mla_hf_quant_config(True))
    assert features.attention == "mla"
    assert features.mla_latent_width == 576
    assert features.kv_cache_quant == "fp8"
    assert len(features.kv_cache_quant_sources) == 2
    clean = model_features(load_entry("tiny-mla"), tiny_model.mla_config({}, False), tiny_model.mla_hf_quant_config(False))
    assert clean.kv_cache_quant is None


def test_tiny_llama_is_plain_attention():
    features = model_features(load_entry("tiny-llama"), tiny_model.llama_config({}))
    assert features.attention == "mha/gqa"
    assert features.head_dim == 32
    assert features.kv_cache_quant is None and features.weight_quant is None


def test_head_dim_from_hidden_size_when_not_given():
    raw = config("llama-3.1-8b.config.json")
    raw.pop("head_dim")
    features = model_features(load_entry("tiny-llama"), raw)
    assert features.head_dim == 4096 // 32
    assert features.num_key_value_heads == 8


def test_without_config_json_the_features_are_unknown_not_guessed():
    features = model_features(load_entry("glm-5"), None)
    assert features.attention is None and features.num_attention_heads is None and features.gguf_model_type is None
    assert features.weight_quant == "gguf"
    only_quant = model_features(load_entry("kimi-k2.5-nvfp4"), None, config("kimi-k2.5-nvfp4.hf_quant_config.json"))
    assert only_quant.kv_cache_quant == "fp8" and only_quant.weight_quant == "nvfp4"
    assert only_quant.configs_read == ("hf_quant_config.json",)


def test_compressed_tensors_int8_kv_scheme_is_not_fp8():
    raw = config("llama-3.1-8b.config.json")
    raw["quantization_config"] = {"quant_method": "compressed-tensors", "kv_cache_scheme": {"num_bits": 8, "type": "int"}}
    features = model_features(load_entry("tiny-llama"), raw)
    assert features.kv_cache_quant == "int8"
    assert features.weight_quant == "compressed-tensors"


def test_strip_patch_removes_every_declaration_features_read():
    # a config that declares the KV cache in every place vLLM reads: after the strip patch none is left
    raw = config("kimi-k2.5-nvfp4.config.json")
    scheme = {"num_bits": 8, "type": "float"}
    for filename, dotted in KV_CACHE_DECLARATIONS:
        if filename == "config.json":
            *parents, last = dotted.split(".")
            node = raw
            for key in parents:
                node = node.setdefault(key, {})
            node[last] = dict(scheme)
    hf_quant = config("kimi-k2.5-nvfp4.hf_quant_config.json")
    entry = load_entry("kimi-k2.5-nvfp4")
    before = model_features(entry, raw, hf_quant)
    assert len(before.kv_cache_quant_sources) == len(KV_CACHE_DECLARATIONS)

    patched = apply_patch(raw, STRIP_KV_CACHE_QUANT.config_json.remove, STRIP_KV_CACHE_QUANT.config_json.set)
    patched_quant = apply_patch(hf_quant, STRIP_KV_CACHE_QUANT.hf_quant_config_json.remove, {})
    after = model_features(entry, patched, patched_quant)
    assert after.kv_cache_quant is None
    # the rest of the quantization config stays: the weights are still NVFP4
    assert after.weight_quant == "nvfp4"
    assert dotted_get(patched, "quantization_config.quant_algo") == "NVFP4"


def test_text_config_helper():
    assert text_config({"a": 1}) == ({"a": 1}, None)
    assert text_config({"text_config": {"b": 2}}) == ({"b": 2}, "text_config")
    assert text_config({"language_config": {"c": 3}}) == ({"c": 3}, "language_config")


def test_features_serialize():
    features = model_features(load_entry("kimi-k2.5-nvfp4"), config("kimi-k2.5-nvfp4.config.json"))
    assert json.loads(json.dumps(features.to_json()))["attention"] == "mla"
