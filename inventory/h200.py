"""A real GPU site: the lent NVIDIA H200 machine converging itself (@local), with no registry and no Hub.

    scripts/gpu_proof.sh          runs this on the GPU machine (see docs/gpu-proof.md)
    pyinfra -y inventory/h200.py deploy.py

Everything comes from the payload that scripts/gpu_payload.py builds and scripts/gpu_unpack.py
unpacks on the machine (HEAVYLIFT_PAYLOAD, default /tmp/hl/payload): vLLM 0.26.0 (the newest
release pinning the image's torch 2.11.0, built for CUDA 13) and its dependencies, installed
offline into a venv that reuses the image's own CUDA torch (vllm.host_packages) instead of
downloading ~3 GB of CUDA wheels. The checkpoints are generated on the machine
(testbed/gpu_checkpoints.py) and served by a Hub stand-in on loopback (benchmarks/static_hub.py).

HEAVYLIFT_H200_DEPLOYMENT picks the deployment. On one H200: "llama-8b" (a Llama-3.1-8B-shaped checkpoint,
port 8000) or "mla" (a Kimi-K2-attention-shaped MLA model declaring an FP8 KV cache, port 8001), side by
side on the one GPU; "kimi-nvfp4" (Kimi-K2.5-NVFP4's layers and ModelOpt NVFP4 quantization, port 8004) and "glm5-dsa"
(GLM-5's sparse MLA with the DSA indexer, port 8005), side by side; "glm5-dsa-fp8" (the same with
--kv-cache-dtype fp8). On eight H200s (mla-dsv3-width, DeepSeek-V3's full width in four layers): "tp8"
(tensor parallel 8 over GPUs 0-7, port 8000), "tp4-a" / "tp4-b" (GPUs 0-3 / 4-7, ports 8002 / 8003).
The machine's operators forbid NVLink multicast (its GPUs are shared; a failing multicast user can take them
out of service): ``nvlink_multicast = False`` writes NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 into the service's environment (models/schema.py SiteSettings.nvlink_multicast; the
launcher exports them and vLLM's worker processes inherit them). Before a start the run checks /dev/shm against
what the tensor parallel ranks need and the memory other processes hold on the chosen GPUs against each
deployment's --gpu-memory-utilization (docs/tp-preflights.md): tp8 at 0.45 beside tp4-a or tp4-b at 0.45 fits.
"""

import os

_PAYLOAD = os.environ.get("HEAVYLIFT_PAYLOAD", "/tmp/hl/payload")
_WHEELHOUSE = f"{_PAYLOAD}/wheelhouse"

# vLLM 0.26.0 requirements a dense or MLA text model never imports, left out of the offline wheelhouse
# (scripts/gpu_payload.py EXCLUDED; the image's own opencv and numba serve any import of them)
_NOT_CARRIED = [
    "torchcodec", "pynvvideocodec", "flashinfer-python", "tilelang", "nvidia-cudnn-frontend", "fastsafetensors",
    "nvidia-cutlass-dsl", "quack-kernels", "tokenspeed-mla", "humming-kernels",
    "opencv-python-headless", "numba", "llvmlite",
]

_DEPLOYMENTS = {
    # one H200 (device kind nvidia-h200): two deployments side by side on GPU 0, each with a share of its memory
    # the generated MLA config has max_position_embeddings 2048 (vLLM refuses a longer max_model_len)
    "llama-8b": {"model": "llama-3.1-8b-shape", "deployment": "llama-8b", "port": 8000, "gpus": [0],
                 "hf_endpoint": "http://127.0.0.1:8390", "extra_args": ["--gpu-memory-utilization", "0.55"]},
    "mla": {"model": "mla-kimi-shape", "deployment": "mla", "port": 8001, "gpus": [0], "max_model_len": 2048,
            "hf_endpoint": "http://127.0.0.1:8391", "extra_args": ["--gpu-memory-utilization", "0.3"]},
    # Kimi-K2.5-NVFP4's layers and quantization (NVFP4 MLPs, FP8 KV declared), 5.88 GB; alone on the GPU, on an
    # H100 (80 GB) as on an H200: 0.5 of the GPU
    "kimi-nvfp4": {"model": "kimi-k2.5-nvfp4-shape", "deployment": "kimi-nvfp4", "port": 8004, "gpus": [0],
                   "hf_endpoint": "http://127.0.0.1:8393", "extra_args": ["--gpu-memory-utilization", "0.5"]},
    # GLM-5's glm_moe_dsa (sparse MLA with the DSA indexer), bf16 safetensors, 5.71 GB; beside kimi-nvfp4 on one GPU
    "glm5-dsa": {"model": "glm-5-dsa-shape", "deployment": "glm5-dsa", "port": 8005, "gpus": [0],
                 "hf_endpoint": "http://127.0.0.1:8394", "extra_args": ["--gpu-memory-utilization", "0.35"]},
    # the same deployment with an FP8 KV cache asked for (a flag change: heavylift restarts it); run alone
    "glm5-dsa-fp8": {"model": "glm-5-dsa-shape", "deployment": "glm5-dsa", "port": 8005, "gpus": [0],
                     "hf_endpoint": "http://127.0.0.1:8394",
                     "extra_args": ["--gpu-memory-utilization", "0.35", "--kv-cache-dtype", "fp8"]},
    # eight H200s (device kind nvidia-h200-x8): DeepSeek-V3's width with tensor parallelism over all eight,
    # then two TP-4 deployments on GPUs 0-3 and 4-7; 0.45 of each GPU, so TP-8 and a TP-4 fit together
    **{
        name: {"model": "mla-dsv3-width", "deployment": f"dsv3-{name}", "port": port, "tensor_parallel_size": len(gpus),
               "gpus": gpus, "hf_endpoint": "http://127.0.0.1:8392", "extra_args": ["--gpu-memory-utilization", "0.45"],
               "download_workers": 16}
        for name, port, gpus in (("tp8", 8000, list(range(8))), ("tp4-a", 8002, [0, 1, 2, 3]), ("tp4-b", 8003, [4, 5, 6, 7]))
    },
}
_chosen = os.environ.get("HEAVYLIFT_H200_DEPLOYMENT", "llama-8b")
# the restart proof's changes (scripts/gpu_proof.sh change, docs/gpu-proof.md "Restarts"): another memory fraction
# is a flag change; a disk margin below the default 20 GB lets a second 16 GB revision land on the 64 GiB disk
if os.environ.get("HEAVYLIFT_H200_GPU_MEMORY"):
    _DEPLOYMENTS[_chosen] = {**_DEPLOYMENTS[_chosen], "extra_args": [
        "--gpu-memory-utilization", os.environ["HEAVYLIFT_H200_GPU_MEMORY"]]}
_DISK = {"disk_margin_gb": float(os.environ["HEAVYLIFT_H200_DISK_MARGIN_GB"])} if os.environ.get(
    "HEAVYLIFT_H200_DISK_MARGIN_GB") else {}

hosts = [
    (
        "@local",
        {
            "root": os.environ.get("HEAVYLIFT_H200_ROOT", "/tmp/hl/heavylift"),
            "vllm": {
                "package": "vllm",
                "version": "0.26.0",
                # the image's Python: the one that holds its CUDA torch 2.11.0+cu130 (a venv itself)
                "python": os.environ.get("HEAVYLIFT_H200_PYTHON", "/opt/torch/.venv/bin/python3"),
                "host_packages": ["torch", "torchvision", "torchaudio"],
                "exclude_packages": _NOT_CARRIED,
                "wheelhouse": _WHEELHOUSE,
                # on @local the wheelhouse is already where the host reads it: uv's wheel is taken from here
                "wheelhouse_upload": _WHEELHOUSE,
            },
            "env": {
                # flashinfer is not carried; vLLM 0.26 uses its sampler by default and the import fails
                "VLLM_USE_FLASHINFER_SAMPLER": "0",
            },
            # this machine's rule: NVLink multicast stays off in every process it starts (see the docstring)
            "nvlink_multicast": False,
            "readiness_timeout": 900,
            "benchmark_tokens": 256,
            "download_workers": 8,
            **_DISK,
            **_DEPLOYMENTS[_chosen],
        },
    ),
]
