"""A deploy of the runtime stage alone (validate, vLLM build resolution, uv, the vLLM venv, the link, the GC).

Used by the runtime end-to-end tests and benchmarks/bench_runtime.py: the same operations deploy.py
runs in its section 3, without the Hub, the weights or a vLLM start.

    pyinfra inventory.py testbed/runtime_deploy.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyinfra import host  # noqa: E402
from pyinfra.operations import files  # noqa: E402

from models.validate import load_deployment  # noqa: E402
from resolve import plan as planning  # noqa: E402
from operations import runtime  # noqa: E402
from resolve.layout import Layout  # noqa: E402

deployment = load_deployment(host)
settings = deployment.settings
layout = Layout(root=settings.root, deployment=deployment.name, uv_cache_dir=settings.uv_cache_dir)
build = planning.resolve_build(deployment, host.name)
venv_plan = planning.vllm_venv_plan(deployment, host.name, build, layout, host_runtime=runtime.host_runtime(settings.vllm))
files.directory(name="heavylift folders", path=layout.deployment_dir)
runtime.uv(name="uv", path=layout.uv, version=settings.uv_version, wheelhouse=settings.vllm.wheelhouse_upload)
runtime.vllm_runtime(deployment, layout, build, venv_plan)
