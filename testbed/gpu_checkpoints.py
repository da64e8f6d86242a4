"""Random-weight checkpoints of real architectures' shapes, made where they are served (a GPU machine has
torch; weights are never carried). Hugging Face layout: config.json, tokenizer, <=5 GB safetensors shards
and their index, so heavylift downloads, verifies and serves them like any Hub checkpoint.

    python3 -m testbed.gpu_checkpoints llama-8b DEST     Llama-3.1-8B's exact tensor shapes, bf16 (16.06 GB)
    python3 -m testbed.gpu_checkpoints mla DEST          a DeepSeek-V3 / Kimi-K2-style MLA + MoE model with
                                                         their attention dimensions, 4 layers, whose configs
                                                         declare an FP8 KV cache as Kimi-K2.5-NVFP4's do
    python3 -m testbed.gpu_checkpoints mla-dsv3-width DEST   the same at DeepSeek-V3's full width (7168, 128 heads,
                                                         64 experts of 2048, 4 layers, ~19 GB): for tensor parallel 8

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


def write_weights(dest: Path, shapes: list[tuple[str, tuple[int, ...]]], tokenizer_ids: int) -> int:
    """Random bf16 weights (randn * 0.02; norms 1; the router's bias float32 0) in <=5 GB shards, the index beside."""
    import torch
    from safetensors.torch import save_file

    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(tiny_model.SEED)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in shapes:
        nbytes = 2 * int(torch.tensor(shape).prod())
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    weight_map, total = {}, 0
    for number, shard in enumerate(shards, start=1):
        filename = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, shape in shard:
            if name.endswith("e_score_correction_bias"):
                tensors[name] = torch.zeros(shape, dtype=torch.float32)
            elif name.endswith("norm.weight"):
                tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
            else:
                tensor = torch.randn(shape, generator=generator, device=device, dtype=torch.float32).mul_(0.02)
                if name == "lm_head.weight":
                    tensor[tokenizer_ids:] = 0
                tensors[name] = tensor.to(torch.bfloat16).cpu()
            weight_map[name] = filename
            total += tensors[name].numel() * tensors[name].element_size()
        save_file(tensors, str(dest / filename), metadata={"format": "pt"})
        (dest / filename).chmod(0o644)
    tiny_model.write_json(dest / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
    return total


def write_checkpoint(kind: str, dest: Path) -> dict:
    started = time.monotonic()
    dest = tiny_model.prepare(dest)
    tokenizer = tiny_model.write_tokenizer(dest)
    ids = tiny_model.special_token_ids(tokenizer)
    if kind == "llama-8b":
        config = {**tiny_model.llama_config(ids), **LLAMA_8B, "max_position_embeddings": 131072, "rope_theta": 500000.0}
        shapes = llama_shapes(LLAMA_8B)
    else:
        dims = MLA if kind == "mla" else DSV3_WIDTH
        config = {**tiny_model.mla_config(ids, kv_cache_quant=True), **dims}
        if kind == "mla-dsv3-width":
            config["max_position_embeddings"] = 4096
        tiny_model.write_json(dest / "hf_quant_config.json", tiny_model.mla_hf_quant_config(kv_cache_quant=True))
        shapes = mla_shapes(dims)
    tiny_model.write_json(dest / "config.json", config)
    tiny_model.write_generation_config(dest, ids)
    total = write_weights(dest, shapes, tokenizer.get_vocab_size())
    tiny_model.write_readme(dest, f"{kind} (random weights)")
    return {"kind": kind, "dest": str(dest), "weight_bytes": total, "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["llama-8b", "mla", "mla-dsv3-width"])
    parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    print(json.dumps(write_checkpoint(args.kind, args.dest)))


if __name__ == "__main__":
    main()
