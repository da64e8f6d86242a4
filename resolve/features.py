"""Model features the compatibility rules look at, read from the catalog entry and the checkpoint's own configs.

Only the small JSON files are needed (config.json, hf_quant_config.json: kilobytes, fetched before
the shards). Multimodal checkpoints nest the language model's config (Kimi K2.5: ``text_config``);
the attention and KV-cache facts come from that inner config, as vLLM's ``hf_text_config`` does.
For a GGUF entry the repository usually has no config.json: pass the base repository's (the
``--tokenizer`` repo the entry names, see ``config_repo``), which is what vLLM maps the GGUF
architecture from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Attention = Literal["mla", "sparse_mla", "mha/gqa"]

# configs of multimodal models keep the language model's config under one of these keys
TEXT_CONFIG_KEYS = ("text_config", "language_config")
# model types whose attention is MLA plus the DeepSeek sparse attention ("DSA") indexer, even if a
# config leaves the index_* keys to their defaults (transformers GlmMoeDsaConfig, DeepseekV32Config)
SPARSE_MLA_MODEL_TYPES = frozenset({"deepseek_v32", "glm_moe_dsa"})
INDEXER_KEYS = ("index_topk", "index_n_heads", "index_head_dim")
# every place a checkpoint declares its KV-cache quantization that vLLM reads (file, dotted key):
# ModelOpt's hf_quant_config.json and config.json's quantization_config (also inside a nested
# language-model config). vLLM 0.17.1-0.34.0 vllm/model_executor/layers/quantization/modelopt.py
# ModelOptQuantConfigBase.from_config reads `quantization.kv_cache_quant_algo` and, for config.json,
# `kv_cache_scheme` ({num_bits: 8, type: float} means FP8). The strip patch removes exactly these.
KV_CACHE_DECLARATIONS = (
    ("hf_quant_config.json", "quantization.kv_cache_quant_algo"),
    ("config.json", "quantization_config.kv_cache_scheme"),
    *(("config.json", f"{key}.quantization_config.kv_cache_scheme") for key in TEXT_CONFIG_KEYS),
)
# the quantization-config keys that name the weight format, most specific first
WEIGHT_QUANT_KEYS = ("quant_algo", "quant_method")


@dataclass(frozen=True)
class ModelFeatures:
    """What a checkpoint is, as far as the compatibility rules care. None = not known (config not given)."""

    format: Literal["safetensors", "gguf"] = "safetensors"
    model_type: str | None = None  # config.json's top-level model_type (kimi_k25)
    text_model_type: str | None = None  # the language model's (kimi_k2 inside kimi_k25); == model_type when not nested
    architectures: tuple[str, ...] = ()
    attention: Attention | None = None
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    head_dim: int | None = None  # per-head size of ordinary attention (head_dim, else hidden_size / heads)
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    num_hidden_layers: int | None = None
    index_topk: int | None = None
    index_n_heads: int | None = None
    index_head_dim: int | None = None
    torch_dtype: str | None = None  # the checkpoint's own dtype (torch_dtype / dtype)
    kv_cache_quant: str | None = None  # "fp8" when the checkpoint declares an FP8 KV cache
    kv_cache_quant_sources: tuple[str, ...] = ()  # where: "hf_quant_config.json: quantization.kv_cache_quant_algo = FP8"
    weight_quant: str | None = None  # "nvfp4", "fp8", "gguf", ... (lower case); None: unquantized or unknown
    weight_quant_source: str | None = None
    gguf_model_type: str | None = None  # the model_type vLLM's GGUF loader maps to a GGUF architecture
    weight_bytes: int | None = None  # total size of the weight files, when the caller knows it
    max_len: int | None = None  # the longest context vLLM derives from config.json (derived_max_len)
    max_len_key: str | None = None  # the config key it comes from (max_position_embeddings, ...)
    max_len_override: int | None = None  # config.json's model_max_length: vLLM accepts up to it anyway
    configs_read: tuple[str, ...] = field(default=())  # which files these features come from

    @property
    def mla_latent_width(self) -> int | None:
        """kv_lora_rank + qk_rope_head_dim: the per-token MLA cache width (576 for DeepSeek-V3-style models)."""
        if self.kv_lora_rank is None or self.qk_rope_head_dim is None:
            return None
        return self.kv_lora_rank + self.qk_rope_head_dim

    def to_json(self) -> dict:
        return {name: (list(value) if isinstance(value, tuple) else value) for name, value in self.__dict__.items()}


def text_config(config: dict) -> tuple[dict, str | None]:
    """The language model's config inside a (possibly multimodal) config.json, and the key it sits under."""
    for key in TEXT_CONFIG_KEYS:
        inner = config.get(key)
        if isinstance(inner, dict) and inner:
            return inner, key
    return config, None


def config_repo(entry) -> str:
    """Where the config.json for an entry's features lives: the Hub repo, or for GGUF the --tokenizer base repo."""
    if entry.format == "gguf":
        args = list(entry.serve.extra_args)
        for i, arg in enumerate(args):
            if arg == "--tokenizer" and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith("--tokenizer="):
                return arg.split("=", 1)[1]
    return entry.hub.repo


# config keys vLLM reads a model's longest context from, the smallest winning; model_max_length wins over all
# (vLLM 0.26.0 vllm/transformers_utils/model_arch_config_convertor.py derive_max_model_len_and_key)
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")


def derived_max_len(text: dict) -> tuple[int | None, str | None]:
    """vLLM's derived max_model_len from the language model's config: the smallest length key, scaled by RoPE.

    vLLM 0.26.0 vllm/config/model.py _get_and_verify_max_len: RoPE types other than su/longrope/llama3
    multiply it by their factor (yarn: original_max_position_embeddings x factor). The tokenizer's
    model_max_length can lower it further at start; heavylift does not read the tokenizer config, so
    this is an upper bound (a refusal on it is never wrong)."""
    found = [(int(text[k]), k) for k in MAX_LEN_KEYS if isinstance(text.get(k), (int, float)) and not isinstance(text.get(k), bool)]
    if not found:
        return None, None
    length, key = min(found)
    if isinstance(text.get("model_max_length"), int):
        length, key = text["model_max_length"], "model_max_length"
    rope = text.get("rope_parameters") or text.get("rope_scaling")
    if isinstance(rope, dict) and rope and "gemma3" not in str(text.get("model_type")):
        ropes = rope.values() if all(isinstance(v, dict) for v in rope.values()) else [rope]
        factor = 1.0
        for each in ropes:
            kind = each.get("rope_type") or each.get("type")
            if kind not in ("su", "longrope", "llama3", None):
                factor = each.get("factor") or factor
                if kind == "yarn" and each.get("original_max_position_embeddings"):
                    length = each["original_max_position_embeddings"]
        length = int(length * factor)
    return length, key


def model_features(
    entry,
    config: dict | None,
    hf_quant_config: dict | None = None,
    weight_bytes: int | None = None,
) -> ModelFeatures:
    """The features of a catalog entry's checkpoint from its pristine config.json and hf_quant_config.json.

    + entry: the ``CatalogEntry`` (its format)
    + config: config.json as a dict (for GGUF: the base repo's), or None when not available
    + hf_quant_config: hf_quant_config.json (ModelOpt's side file) as a dict, or None
    + weight_bytes: total bytes of the weight files (the snapshot's listing), or None
    """
    fmt = entry.format
    read = tuple(name for name, doc in (("config.json", config), ("hf_quant_config.json", hf_quant_config)) if doc)
    if not config:
        kv, kv_sources = _kv_cache_quant({}, hf_quant_config or {})
        weight_quant, weight_source = _weight_quant(fmt, {}, None, hf_quant_config or {})
        return ModelFeatures(
            format=fmt, kv_cache_quant=kv, kv_cache_quant_sources=kv_sources, weight_quant=weight_quant,
            weight_quant_source=weight_source, weight_bytes=weight_bytes, configs_read=read,
        )

    text, text_key = text_config(config)
    model_type = _str(config.get("model_type"))
    text_model_type = _str(text.get("model_type")) or model_type
    heads = _int(text.get("num_attention_heads"))
    kv_lora_rank = _int(text.get("kv_lora_rank"))
    index_topk = _int(text.get("index_topk"))
    head_dim = _int(text.get("head_dim"))
    hidden = _int(text.get("hidden_size"))
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads

    if kv_lora_rank:
        has_indexer = any(text.get(key) is not None for key in INDEXER_KEYS)
        sparse = has_indexer or text_model_type in SPARSE_MLA_MODEL_TYPES or model_type in SPARSE_MLA_MODEL_TYPES
        attention: Attention = "sparse_mla" if sparse else "mla"
    else:
        attention = "mha/gqa"

    kv, kv_sources = _kv_cache_quant(config, hf_quant_config or {})
    weight_quant, weight_source = _weight_quant(fmt, config, text_key, hf_quant_config or {})
    max_len, max_len_key = derived_max_len(text)
    return ModelFeatures(
        max_len=max_len,
        max_len_key=max_len_key,
        max_len_override=_int(config.get("model_max_length")),
        format=fmt,
        model_type=model_type,
        text_model_type=text_model_type,
        architectures=tuple(config.get("architectures") or text.get("architectures") or ()),
        attention=attention,
        kv_lora_rank=kv_lora_rank,
        q_lora_rank=_int(text.get("q_lora_rank")),
        qk_nope_head_dim=_int(text.get("qk_nope_head_dim")),
        qk_rope_head_dim=_int(text.get("qk_rope_head_dim")),
        v_head_dim=_int(text.get("v_head_dim")),
        head_dim=head_dim,
        num_attention_heads=heads,
        num_key_value_heads=_int(text.get("num_key_value_heads")) or heads,
        num_hidden_layers=_int(text.get("num_hidden_layers")),
        index_topk=index_topk,
        index_n_heads=_int(text.get("index_n_heads")),
        index_head_dim=_int(text.get("index_head_dim")),
        torch_dtype=_str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or config.get("dtype")),
        kv_cache_quant=kv,
        kv_cache_quant_sources=kv_sources,
        weight_quant=weight_quant,
        weight_quant_source=weight_source,
        # vLLM's GGUF loader maps hf_config.model_type, the top-level one (0.23.0 gguf_loader.py
        # _get_gguf_weights_map; vllm-gguf-plugin 0.0.5 weights_adapter/default.py build_name_map)
        gguf_model_type=model_type if fmt == "gguf" else None,
        weight_bytes=weight_bytes,
        configs_read=read,
    )


def _kv_cache_quant(config: dict, hf_quant: dict) -> tuple[str | None, tuple[str, ...]]:
    """The KV-cache quantization a checkpoint declares, and every place (KV_CACHE_DECLARATIONS) it does."""
    documents = {"config.json": config, "hf_quant_config.json": hf_quant}
    found: list[tuple[str, str]] = []  # (kind, description)
    for filename, dotted in KV_CACHE_DECLARATIONS:
        value = dotted_get(documents[filename], dotted)
        if isinstance(value, dict):
            shown = ", ".join(f"{k}: {value[k]}" for k in ("num_bits", "type") if k in value)
            found.append((_scheme_kind(value), f"{filename}: {dotted} = {{{shown}}}"))
        elif value:
            found.append((str(value).lower(), f"{filename}: {dotted} = {value}"))
    if not found:
        return None, ()
    kinds = [kind for kind, _ in found]
    # fp8 wins when the files disagree: it is the one the rules act on
    kind = "fp8" if "fp8" in kinds else kinds[0]
    return kind, tuple(description for _, description in found)


def dotted_get(document: Any, dotted: str) -> Any:
    """document["a"]["b"] for "a.b"; None when a key is missing or a parent is not a mapping."""
    node = document
    for key in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _scheme_kind(scheme: dict) -> str:
    bits, kind = scheme.get("num_bits"), str(scheme.get("type", "")).lower()
    if bits == 8 and kind == "float":
        return "fp8"
    return f"{kind or 'unknown'}{bits or ''}"


def _weight_quant(fmt: str, config: dict, text_key: str | None, hf_quant: dict) -> tuple[str | None, str | None]:
    if fmt == "gguf":
        return "gguf", "format: gguf (the catalog entry)"
    quantization = hf_quant.get("quantization")
    if isinstance(quantization, dict) and quantization.get("quant_algo"):
        algo = str(quantization["quant_algo"])
        source = f"hf_quant_config.json: quantization.quant_algo = {algo}"
        if _excludes_everything(quantization.get("exclude_modules")):
            return None, f"{source}, but quantization.exclude_modules ['*'] leaves every module unquantized"
        return algo.lower(), source
    places = [("quantization_config", config.get("quantization_config"))]
    if text_key:
        places.append((f"{text_key}.quantization_config", (config.get(text_key) or {}).get("quantization_config")))
    for path, qc in places:
        if isinstance(qc, dict):
            for key in WEIGHT_QUANT_KEYS:
                if qc.get(key):
                    source = f"config.json: {path}.{key} = {qc[key]}"
                    if _excludes_everything(qc.get("ignore")):
                        return None, f"{source}, but {path}.ignore ['*'] leaves every module unquantized"
                    return str(qc[key]).lower(), source
    return None, None


def _excludes_everything(patterns: Any) -> bool:
    """A ModelOpt exclusion list (hf_quant_config.json exclude_modules, config.json ignore) with the wildcard "*":
    vLLM's ModelOptQuantConfigBase.is_layer_excluded matches every prefix with fnmatch, so no layer is quantized
    (vllm/model_executor/layers/quantization/modelopt.py, 0.26.0). Only the KV-cache declaration still counts."""
    return isinstance(patterns, list) and "*" in patterns


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
