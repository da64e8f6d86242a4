"""A real GPU site: the lent NVIDIA H200 machine converging itself (@local), with no registry and no Hub.

    scripts/gpu_proof.sh          runs this on the GPU machine (see docs/gpu-proof.md)
    pyinfra -y inventory/h200.py deploy.py

Everything comes from the payload that scripts/gpu_payload.py builds and scripts/gpu_unpack.py
unpacks on the machine (HEAVYLIFT_PAYLOAD, default /tmp/hl/payload): vLLM 0.26.0 (the newest
release pinning the image's torch 2.11.0, built for CUDA 13) and its dependencies, installed
offline into a venv that reuses the image's own CUDA torch (vllm.host_packages) instead of
downloading ~3 GB of CUDA wheels. The checkpoints are generated on the machine
(testbed/gpu_checkpoints.py) and served by a Hub stand-in on loopback (benchmarks/static_hub.py).

HEAVYLIFT_H200_DEPLOYMENT picks the deployment: "llama-8b" (a Llama-3.1-8B-shaped checkpoint, port
8000) or "mla" (a Kimi-K2-attention-shaped MLA model declaring an FP8 KV cache, port 8001). Both run
side by side on the one GPU, each with a share of its memory.
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
    "llama-8b": {"model": "llama-3.1-8b-shape", "port": 8000, "hf_endpoint": "http://127.0.0.1:8390",
                 "extra_args": ["--gpu-memory-utilization", "0.55"]},
    # the generated MLA config has max_position_embeddings 2048 (vLLM refuses a longer max_model_len)
    "mla": {"model": "mla-kimi-shape", "port": 8001, "hf_endpoint": "http://127.0.0.1:8391", "max_model_len": 2048,
            "extra_args": ["--gpu-memory-utilization", "0.3"]},
}
_chosen = os.environ.get("HEAVYLIFT_H200_DEPLOYMENT", "llama-8b")

hosts = [
    (
        "@local",
        {
            **_DEPLOYMENTS[_chosen],
            "deployment": _chosen,
            "root": os.environ.get("HEAVYLIFT_H200_ROOT", "/tmp/hl/heavylift"),
            "gpus": [0],
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
                # this machine's rule: NVLink multicast stays off, in every process it starts
                "NCCL_NVLS_ENABLE": "0",
                "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1",
            },
            "readiness_timeout": 900,
            "benchmark_tokens": 256,
            "download_workers": 8,
        },
    ),
]
