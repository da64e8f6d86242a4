"""Settings for every host in the kimi_hosts group (see inventory/kimi-8x-rtx-pro-6000.py)."""

model = "kimi-k2.5-nvfp4"
deployment = "kimi"
bind_address = "0.0.0.0"
port = 8000
tensor_parallel_size = 8
vllm = {
    "package": "vllm",
    "version": "0.34.0",
}
# 540 GB of weights on NVMe, then warm-up and CUDA graph capture
readiness_timeout = 3600
download_workers = 16
