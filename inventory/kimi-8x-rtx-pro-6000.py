"""Production example: one host with 8x NVIDIA RTX PRO 6000 Blackwell (SM120, 96 GB each) serving
nvidia/Kimi-K2.5-NVFP4 with tensor parallelism over the eight GPUs.

    pyinfra inventory/kimi-8x-rtx-pro-6000.py deploy.py --dry --diff   # preview
    pyinfra inventory/kimi-8x-rtx-pro-6000.py deploy.py                # converge

The deployment settings live in group_data/kimi_hosts.py, shared by every host of the group.
"""

kimi_hosts = [
    ("gpu-node-1.example.internal", {"ssh_user": "ubuntu", "_sudo": True}),
]
