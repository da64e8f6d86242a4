"""A real 8-GPU site: an 8x H200 machine (device kind nvidia-h200-x8) converging itself (@local), with no
registry and no Hub: tensor parallelism across eight GPUs, then two TP-4 deployments side by side.

    HEAVYLIFT_PROOF_INVENTORY=inventory/h200x8.py scripts/gpu_proof.sh converge tp8 1

The same payload and image as inventory/h200.py (vLLM 0.26.0 offline, the image's torch reused). The
model is mla-dsv3-width: DeepSeek-V3's full width in four layers, declaring Kimi's FP8 KV cache,
generated on the machine. HEAVYLIFT_H200_DEPLOYMENT picks:
- "tp8": one vLLM over GPUs 0-7 (tensor_parallel_size 8), port 8000;
- "tp4-a" / "tp4-b": two deployments on GPUs 0-3 and 4-7 (tensor_parallel_size 4), ports 8002 / 8003.
Each takes 0.45 of its GPUs' memory, so the TP-8 service and a TP-4 one fit on the same GPUs.

NVLink multicast stays off on that machine: the service's environment carries NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 (the launcher exports them, and vLLM's
worker processes inherit them).
"""

import os

_PAYLOAD = os.environ.get("HEAVYLIFT_PAYLOAD", "/tmp/hl/payload")
_WHEELHOUSE = f"{_PAYLOAD}/wheelhouse"
# as in inventory/h200.py: vLLM 0.26.0 requirements a dense or MLA text model never imports
_NOT_CARRIED = [
    "torchcodec", "pynvvideocodec", "flashinfer-python", "tilelang", "nvidia-cudnn-frontend", "fastsafetensors",
    "nvidia-cutlass-dsl", "quack-kernels", "tokenspeed-mla", "humming-kernels",
    "opencv-python-headless", "numba", "llvmlite",
]
_DEPLOYMENTS = {
    "tp8": {"port": 8000, "tensor_parallel_size": 8, "gpus": [0, 1, 2, 3, 4, 5, 6, 7]},
    "tp4-a": {"port": 8002, "tensor_parallel_size": 4, "gpus": [0, 1, 2, 3]},
    "tp4-b": {"port": 8003, "tensor_parallel_size": 4, "gpus": [4, 5, 6, 7]},
}
_chosen = os.environ.get("HEAVYLIFT_H200_DEPLOYMENT", "tp8")

hosts = [
    (
        "@local",
        {
            **_DEPLOYMENTS[_chosen],
            "model": "mla-dsv3-width",
            "deployment": f"dsv3-{_chosen}",
            "hf_endpoint": "http://127.0.0.1:8392",
            "extra_args": ["--gpu-memory-utilization", "0.45"],
            "root": os.environ.get("HEAVYLIFT_H200_ROOT", "/tmp/hl/heavylift"),
            "vllm": {
                "package": "vllm",
                "version": "0.26.0",
                "python": os.environ.get("HEAVYLIFT_H200_PYTHON", "/opt/torch/.venv/bin/python3"),
                "host_packages": ["torch", "torchvision", "torchaudio"],
                "exclude_packages": _NOT_CARRIED,
                "wheelhouse": _WHEELHOUSE,
                "wheelhouse_upload": _WHEELHOUSE,
            },
            "env": {
                "VLLM_USE_FLASHINFER_SAMPLER": "0",
                "NCCL_NVLS_ENABLE": "0",
                "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1",
            },
            "readiness_timeout": 900,
            "benchmark_tokens": 256,
            "download_workers": 16,
        },
    ),
]
