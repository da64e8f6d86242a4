"""The GPU checkpoints' layouts (testbed/gpu_checkpoints.py), checked without torch: the names, shapes and
kinds vLLM 0.26.0's loaders expect, and the quantization files as the real repos lay them out."""

from __future__ import annotations

from fnmatch import fnmatch

from resolve.features import model_features
from models.catalog import load_entry
from testbed import gpu_checkpoints as g
from testbed import tiny_model


def _by_name(shapes):
    return {entry[0]: (entry[1], entry[2] if len(entry) > 2 else "bf16") for entry in shapes}


def _excluded(prefix: str) -> bool:
    # vLLM's ModelOptQuantConfigBase.is_layer_excluded: substring or fnmatch of each pattern
    return any(p in prefix or fnmatch(prefix, p) for p in g.KIMI_NVFP4_EXCLUDED)


def test_kimi_nvfp4_quantizes_every_mlp_projection_as_modelopt_does():
    c = g.KIMI_NVFP4
    shapes = _by_name(g.kimi_nvfp4_shapes(c))
    h, inner = c["hidden_size"], c["moe_intermediate_size"]
    p = "model.layers.1.mlp.experts.63."
    # ModelOptNvFp4FusedMoE.create_weights: uint8 [out, in/2], fp8 [out, in/16], fp32 scalars per expert
    assert shapes[p + "gate_proj.weight"] == ((inner, h // 2), "fp4")
    assert shapes[p + "gate_proj.weight_scale"] == ((inner, h // 16), "fp8-block-scale")
    assert shapes[p + "down_proj.weight"] == ((h, inner // 2), "fp4")
    assert shapes[p + "down_proj.weight_scale_2"] == ((), "weight-global-scale")
    assert shapes[p + "up_proj.input_scale"] == ((), "input-global-scale")
    # the dense first layer and the shared experts are NVFP4 too; attention, routers and lm_head are not
    assert shapes["model.layers.0.mlp.gate_proj.weight"][1] == "fp4"
    assert shapes["model.layers.1.mlp.shared_experts.down_proj.weight"][1] == "fp4"
    for name, (_, kind) in shapes.items():
        module = name.rsplit(".", 1)[0]
        if kind == "bf16" and ("self_attn" in name or name.startswith("lm_head") or ".mlp.gate." in name):
            assert _excluded(module), name
        if kind == "fp4":
            assert not _excluded(module), name
    assert not any(".mlp.experts." in n for n, (_, k) in shapes.items() if k == "bf16")
    # what the generator wrote on the GPU machine (model.safetensors.index.json total_size, 2026-12-06)
    assert g.checkpoint_bytes(g.kimi_nvfp4_shapes(c)) == 5_880_171_872


def test_kimi_nvfp4_declares_what_the_real_repo_declares():
    quantization_config, hf_quant_config = g.kimi_nvfp4_quant_files()
    q = hf_quant_config["quantization"]
    assert q["quant_algo"] == "NVFP4" and q["kv_cache_quant_algo"] == "FP8" and q["group_size"] == 16
    assert q["exclude_modules"] == quantization_config["ignore"] == g.KIMI_NVFP4_EXCLUDED
    assert quantization_config["quant_method"] == "modelopt"
    assert quantization_config["kv_cache_scheme"] == {"dynamic": False, "num_bits": 8, "type": "float"}
    config = {**tiny_model.mla_config({}, True), **g.KIMI_NVFP4, "quantization_config": quantization_config}
    features = model_features(load_entry("kimi-k2.5-nvfp4-shape"), config, hf_quant_config)
    assert features.weight_quant == "nvfp4" and features.kv_cache_quant == "fp8" and features.attention == "mla"


def test_glm5_dsa_has_the_indexer_vllm_loads():
    c = g.GLM5_DSA
    shapes = _by_name(g.glm5_dsa_shapes(c))
    p = "model.layers.3.self_attn."
    assert shapes[p + "indexer.wq_b.weight"][0] == (c["index_n_heads"] * c["index_head_dim"], c["q_lora_rank"])
    assert shapes[p + "indexer.wk.weight"][0] == (c["index_head_dim"], c["hidden_size"])
    assert shapes[p + "indexer.weights_proj.weight"][0] == (c["index_n_heads"], c["hidden_size"])
    assert shapes[p + "indexer.k_norm.bias"] == ((c["index_head_dim"],), "zeros")
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    assert shapes[p + "q_b_proj.weight"][0] == (c["num_attention_heads"] * qk, c["q_lora_rank"])
    config = {**tiny_model.mla_config({}, False), **c, "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa"}
    config.pop("quantization_config")
    assert g.checkpoint_bytes(g.glm5_dsa_shapes(c)) == 5_711_792_320  # as written on the GPU machine
    features = model_features(load_entry("glm-5-dsa-shape"), config, None)
    assert features.attention == "sparse_mla" and features.index_topk == 2048 and features.weight_quant is None
