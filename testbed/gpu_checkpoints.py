"""Random-weight checkpoints of real architectures' shapes, made where they are served (a GPU machine has
torch; weights are never carried). Hugging Face layout: config.json, tokenizer, <=5 GB safetensors shards
and their index, so heavylift downloads, verifies and serves them like any Hub checkpoint.

    python3 -m testbed.gpu_checkpoints llama-8b DEST     Llama-3.1-8B's exact tensor shapes, bf16 (16.06 GB)
    python3 -m testbed.gpu_checkpoints mla DEST          a DeepSeek-V3 / Kimi-K2-style MLA + MoE model with
                                                         their attention dimensions, 4 layers, whose configs
                                                         declare an FP8 KV cache as Kimi-K2.5-NVFP4's do
    python3 -m testbed.gpu_checkpoints mla-dsv3-width DEST   the same at DeepSeek-V3's full width (7168, 128 heads,
                                                         64 experts of 2048, 4 layers, ~19 GB): for tensor parallel 8
    python3 -m testbed.gpu_checkpoints kimi-nvfp4 DEST   nvidia/Kimi-K2.5-NVFP4's language model at its full width
                                                         (7168, 64 heads, MLA, experts of 2048, top 8) in 4 layers and
                                                         64 experts instead of 61 and 384, with ModelOpt NVFP4
                                                         MLPs and the repo's two quantization files (~5.9 GB)

    python3 -m testbed.gpu_checkpoints glm5-dsa DEST     GLM-5's glm_moe_dsa at its full width (6144, 64 heads, MLA with
                                                         qk_nope 192 / v_head 256, the DSA indexer: 32 heads of 128,
                                                         index_topk 2048) in 4 layers and 16 experts, bf16 (~5.6 GB)

kimi-nvfp4 is quantized as NVIDIA's ModelOpt exports Kimi-K2.5: every MLP projection (routed and shared experts,
the dense first layer) is NVFP4 (``weight`` uint8, two E2M1 values a byte along the input dimension;
``weight_scale`` float8_e4m3fn, one per 16 inputs; ``weight_scale_2`` and ``input_scale`` float32 scalars);
what ``exclude_modules`` names stays bf16: the MLA attention, the routers (``mlp.gate``) and ``lm_head``.
``hf_quant_config.json`` (``quantization.quant_algo`` NVFP4, ``kv_cache_quant_algo`` FP8, ``exclude_modules``)
and config.json's ``quantization_config`` (quant_method modelopt, ``ignore``, ``kv_cache_scheme`` 8-bit float)
declare the same, as the real repo's do. Kimi-K2.5 itself is ``kimi_k25`` (KimiK25ForConditionalGeneration:
this language model under ``language_model.`` beside a MoonViT vision tower, Kimi's tiktoken tokenizer and
processor); the vision side is not reproduced here, the language model (vLLM builds the same
DeepseekV2ForCausalLM class for it) is served as DeepseekV3ForCausalLM.

The tokenizer is the testbed's (testbed/tiny_model.py, 512 ids). A Llama-3.1 vocabulary has 128256 rows:
lm_head rows past the tokenizer's ids are zero, so their logit (0) stays below the best of 512 random
logits and greedy decoding never emits an id the tokenizer lacks.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from testbed import tiny_model

SHARD_BYTES = 5 * 10**9

LLAMA_8B = {  # meta-llama/Llama-3.1-8B config.json
    "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
}
# DeepSeek-V3 / Kimi-K2 attention (kv_lora_rank 512, q_lora_rank 1536, qk_nope 128, qk_rope 64, v_head 128)
# with fewer heads, layers and experts, so it loads in seconds and fits one GPU
MLA = {
    "vocab_size": 512, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 4,
    "num_attention_heads": 16, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 16, "num_experts_per_tok": 4,
    "moe_intermediate_size": 1024, "n_shared_experts": 1, "first_k_dense_replace": 1,
}


# DeepSeek-V3 / Kimi-K2 at full width (hidden 7168, 128 heads, MLA dims, routing of 8 groups, top-8 experts,
# expert MLP 2048) in 4 layers (1 dense, 3 MoE) and 64 experts instead of 61 layers and 256/384: ~19 GB of
# bf16, so tensor parallelism over 8 GPUs splits real-width matrices and it still loads in a minute
DSV3_WIDTH = {
    "vocab_size": 512, "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 4,
    "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64, "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 8, "topk_group": 4,
}


# nvidia/Kimi-K2.5-NVFP4's text_config (Kimi-K2's DeepSeek-V3 layout: 64 heads, hidden 7168, MLA ranks, experts
# of 2048, top 8 of 384 in one group, sigmoid routing scaled by 2.827, YaRN x64 over 4096 positions) with 4
# layers (1 dense, 3 MoE) and 64 routed experts instead of 61 and 384
KIMI_NVFP4 = {
    "vocab_size": 512, "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 4,
    "num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64,
    "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "n_shared_experts": 1, "first_k_dense_replace": 1,
    "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.827, "max_position_embeddings": 262144,
    "rope_theta": 50000.0,
    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
}
NVFP4_GROUP = 16
# the modules ModelOpt leaves in bf16 in nvidia/Kimi-K2.5-NVFP4 (its exclude_modules / ignore, verbatim:
# tests/fixtures/configs/kimi-k2.5-nvfp4.*): MLA attention, the routers, lm_head and the vision side; every
# MLP projection (routed and shared experts, the dense first layer) is NVFP4. vLLM's
# ModelOptQuantConfigBase.is_layer_excluded matches them with fnmatch
KIMI_NVFP4_EXCLUDED = ["lm_head", "mm_projector*", "vision_tower*", "*.self_attn*", "*.mlp.gate"]


def kimi_nvfp4_quant_files() -> tuple[dict, dict]:
    """(config.json's quantization_config, hf_quant_config.json), laid out as nvidia/Kimi-K2.5-NVFP4's."""
    quantization_config = {
        "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": NVFP4_GROUP,
        "ignore": list(KIMI_NVFP4_EXCLUDED), "kv_cache_scheme": dict(tiny_model.KV_CACHE_SCHEME),
        "producer": dict(tiny_model.MODELOPT_PRODUCER),
    }
    hf_quant_config = {
        "producer": dict(tiny_model.MODELOPT_PRODUCER),
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": NVFP4_GROUP,
                         "exclude_modules": list(KIMI_NVFP4_EXCLUDED)},
    }
    return quantization_config, hf_quant_config


def nvfp4_linear(name: str, out_features: int, in_features: int) -> list[tuple]:
    """A ModelOpt NVFP4 linear's four tensors (name, shape, kind) for ``name`` = ``...proj``."""
    return [
        (f"{name}.weight", (out_features, in_features // 2), "fp4"),
        (f"{name}.weight_scale", (out_features, in_features // NVFP4_GROUP), "fp8-block-scale"),
        (f"{name}.weight_scale_2", (), "weight-global-scale"),
        (f"{name}.input_scale", (), "input-global-scale"),
    ]


def kimi_nvfp4_shapes(c: dict) -> list[tuple]:
    """mla_shapes with every MLP projection (gate/up/down of the experts, the shared experts and the dense
    layer) as NVFP4; attention, routers, norms, embeddings and lm_head bf16."""
    shapes: list[tuple] = []
    for name, shape in mla_shapes(c):
        if ".mlp." in name and name.endswith("_proj.weight"):
            out_features, in_features = shape
            shapes += nvfp4_linear(name.removesuffix(".weight"), out_features, in_features)
        else:
            shapes.append((name, shape))
    return shapes


# GLM-5's config.json (zai-org/GLM-5, model_type glm_moe_dsa: tests/fixtures/configs/glm-5.config.json) with 4
# layers (1 dense, 3 MoE) and 16 routed experts instead of 78 (3 dense) and 256
GLM5_DSA = {
    "vocab_size": 512, "hidden_size": 6144, "intermediate_size": 12288, "moe_intermediate_size": 2048,
    "num_hidden_layers": 4, "num_attention_heads": 64, "num_key_value_heads": 64, "n_shared_experts": 1,
    "n_routed_experts": 16, "num_experts_per_tok": 8, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
    "n_group": 1, "topk_group": 1, "kv_lora_rank": 512, "q_lora_rank": 2048, "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64, "v_head_dim": 256, "index_topk": 2048, "index_n_heads": 32, "index_head_dim": 128,
    "max_position_embeddings": 202752, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
}


def glm5_dsa_shapes(c: dict) -> list[tuple]:
    """mla_shapes plus each layer's DSA indexer (vLLM 0.26.0 vllm/model_executor/models/deepseek_v2.py Indexer:
    wq_b, wk and weights_proj (loaded fused as wk_weights_proj), k_norm a LayerNorm with its bias)."""
    h, n, d = c["hidden_size"], c["index_n_heads"], c["index_head_dim"]
    shapes: list[tuple] = []
    for name, shape in mla_shapes(c):
        shapes.append((name, shape))
        if name.endswith("self_attn.o_proj.weight"):
            p = name.removesuffix("o_proj.weight") + "indexer."
            shapes += [(p + "wq_b.weight", (n * d, c["q_lora_rank"])), (p + "wk.weight", (d, h)),
                       (p + "weights_proj.weight", (n, h)), (p + "k_norm.weight", (d,)), (p + "k_norm.bias", (d,), "zeros")]
    return shapes


def llama_shapes(c: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, kv = c["hidden_size"], c["num_key_value_heads"] * c["head_dim"]
    shapes = [("model.embed_tokens.weight", (c["vocab_size"], h))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (h,)), (p + "self_attn.q_proj.weight", (c["num_attention_heads"] * c["head_dim"], h)),
            (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, c["num_attention_heads"] * c["head_dim"])),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (c["intermediate_size"], h)), (p + "mlp.up_proj.weight", (c["intermediate_size"], h)),
            (p + "mlp.down_proj.weight", (h, c["intermediate_size"])),
        ]
    return shapes + [("model.norm.weight", (h,)), ("lm_head.weight", (c["vocab_size"], h))]


def mla_shapes(c: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, heads = c["hidden_size"], c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]

    def mlp(p: str, inner: int):
        return [(p + "gate_proj.weight", (inner, h)), (p + "up_proj.weight", (inner, h)), (p + "down_proj.weight", (h, inner))]

    shapes = [("model.embed_tokens.weight", (c["vocab_size"], h))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (a + "q_a_proj.weight", (c["q_lora_rank"], h)), (a + "q_a_layernorm.weight", (c["q_lora_rank"],)),
            (a + "q_b_proj.weight", (heads * qk, c["q_lora_rank"])),
            (a + "kv_a_proj_with_mqa.weight", (c["kv_lora_rank"] + c["qk_rope_head_dim"], h)),
            (a + "kv_a_layernorm.weight", (c["kv_lora_rank"],)),
            (a + "kv_b_proj.weight", (heads * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"])),
            (a + "o_proj.weight", (h, heads * c["v_head_dim"])),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
        if i < c["first_k_dense_replace"]:
            shapes += mlp(p + "mlp.", c["intermediate_size"])
        else:
            shapes += [(p + "mlp.gate.weight", (c["n_routed_experts"], h)), (p + "mlp.gate.e_score_correction_bias", (c["n_routed_experts"],))]
            shapes += mlp(p + "mlp.shared_experts.", c["moe_intermediate_size"] * c["n_shared_experts"])
            for e in range(c["n_routed_experts"]):
                shapes += mlp(f"{p}mlp.experts.{e}.", c["moe_intermediate_size"])
    return shapes + [("model.norm.weight", (h,)), ("lm_head.weight", (c["vocab_size"], h))]


# bytes per element of each kind of tensor (bf16 unless named)
KIND_BYTES = {"bf16": 2, "zeros": 2, "fp4": 1, "fp8-block-scale": 1, "weight-global-scale": 4, "input-global-scale": 4}


def random_tensor(name: str, shape: tuple[int, ...], kind: str, generator, device: str, tokenizer_ids: int):
    """One tensor of the checkpoint. bf16: randn * 0.02 (norms 1; the router's bias float32 0).

    NVFP4, as ModelOpt stores it: random bytes are two random E2M1 codes each (values up to 6, RMS ~2.9);
    the block scales (float8_e4m3fn) lie in [112, 224) and the global weight scale is amax / (6 * 448) for
    amax 0.1, so a dequantized weight (code x block scale x global scale) has an RMS of 0.012-0.024, like the
    bf16 layers; input_scale is an activation amax of 4 over (6 * 448).
    """
    import torch

    if kind == "fp4":
        return torch.randint(0, 256, shape, generator=generator, device=device, dtype=torch.uint8).cpu()
    if kind == "fp8-block-scale":
        scales = torch.rand(shape, generator=generator, device=device, dtype=torch.float32).mul_(112).add_(112)
        return scales.to(torch.float8_e4m3fn).cpu()
    if kind == "weight-global-scale":
        return torch.tensor(0.1 / (6 * 448), dtype=torch.float32)
    if kind == "input-global-scale":
        return torch.tensor(4.0 / (6 * 448), dtype=torch.float32)
    if name.endswith("e_score_correction_bias"):
        return torch.zeros(shape, dtype=torch.float32)
    if kind == "zeros":
        return torch.zeros(shape, dtype=torch.bfloat16)
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=torch.bfloat16)
    tensor = torch.randn(shape, generator=generator, device=device, dtype=torch.float32).mul_(0.02)
    if name == "lm_head.weight":
        tensor[tokenizer_ids:] = 0
    return tensor.to(torch.bfloat16).cpu()


def tensor_bytes(name: str, shape: tuple[int, ...], kind: str = "bf16") -> int:
    """The bytes random_tensor writes for one entry (the router's bias is float32)."""
    import math

    per_value = 4 if name.endswith("e_score_correction_bias") else KIND_BYTES[kind]
    return per_value * math.prod(shape)


def checkpoint_bytes(shapes: list[tuple]) -> int:
    return sum(tensor_bytes(*entry) for entry in shapes)


def write_weights(dest: Path, shapes: list[tuple], tokenizer_ids: int) -> int:
    """Random weights in <=5 GB shards, the index beside. ``shapes``: (name, shape) for bf16, or
    (name, shape, kind) with a kind of ``KIND_BYTES``."""
    import torch
    from safetensors.torch import save_file

    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(tiny_model.SEED)
    specs = [(entry[0], entry[1], entry[2] if len(entry) > 2 else "bf16") for entry in shapes]
    shards: list[list[tuple]] = [[]]
    size = 0
    for name, shape, kind in specs:
        nbytes = tensor_bytes(name, shape, kind)
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape, kind))
        size += nbytes
    weight_map, total = {}, 0
    for number, shard in enumerate(shards, start=1):
        filename = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, shape, kind in shard:
            tensors[name] = random_tensor(name, shape, kind, generator, device, tokenizer_ids)
            weight_map[name] = filename
            total += tensors[name].numel() * tensors[name].element_size()
        save_file(tensors, str(dest / filename), metadata={"format": "pt"})
        (dest / filename).chmod(0o644)
    tiny_model.write_json(dest / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
    return total


def checkpoint_files(kind: str, ids: dict[str, int]) -> tuple[dict, dict | None, list[tuple]]:
    """(config.json, hf_quant_config.json or None, the tensors' shapes) of a kind; ``ids``: the tokenizer's
    special token ids (tiny_model.special_token_ids)."""
    hf_quant_config = None
    if kind == "llama-8b":
        config = {**tiny_model.llama_config(ids), **LLAMA_8B, "max_position_embeddings": 131072, "rope_theta": 500000.0}
        shapes = llama_shapes(LLAMA_8B)
    elif kind == "glm5-dsa":
        config = {**tiny_model.mla_config(ids, kv_cache_quant=False), **GLM5_DSA,
                  "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa"}
        config.pop("quantization_config")
        shapes = glm5_dsa_shapes(GLM5_DSA)
    elif kind == "kimi-nvfp4":
        quantization_config, hf_quant_config = kimi_nvfp4_quant_files()
        config = {**tiny_model.mla_config(ids, kv_cache_quant=True), **KIMI_NVFP4, "quantization_config": quantization_config}
        shapes = kimi_nvfp4_shapes(KIMI_NVFP4)
    else:
        dims = MLA if kind == "mla" else DSV3_WIDTH
        config = {**tiny_model.mla_config(ids, kv_cache_quant=True), **dims}
        if kind == "mla-dsv3-width":
            config["max_position_embeddings"] = 4096
        hf_quant_config = tiny_model.mla_hf_quant_config(kv_cache_quant=True)
        shapes = mla_shapes(dims)
    return config, hf_quant_config, shapes


def write_checkpoint(kind: str, dest: Path) -> dict:
    started = time.monotonic()
    dest = tiny_model.prepare(dest)
    tokenizer = tiny_model.write_tokenizer(dest)
    ids = tiny_model.special_token_ids(tokenizer)
    config, hf_quant_config, shapes = checkpoint_files(kind, ids)
    if hf_quant_config is not None:
        tiny_model.write_json(dest / "hf_quant_config.json", hf_quant_config)
    tiny_model.write_json(dest / "config.json", config)
    tiny_model.write_generation_config(dest, ids)
    total = write_weights(dest, shapes, tokenizer.get_vocab_size())
    tiny_model.write_readme(dest, f"{kind} (random weights)")
    return {"kind": kind, "dest": str(dest), "weight_bytes": total, "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["llama-8b", "mla", "mla-dsv3-width", "kimi-nvfp4", "glm5-dsa"])
    parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    print(json.dumps(write_checkpoint(args.kind, args.dest)))


if __name__ == "__main__":
    main()
