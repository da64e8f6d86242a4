"""resolve/neighbours.py: what another deployment's launcher serves on, read back from the text heavylift renders
(templates/serve.sh.j2 through release.launcher_lines, as deploy.py does), and the port and GPUs a deployment may
take beside the others on the host."""

from __future__ import annotations

import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.api.util import get_template

from models.errors import HeavyliftConfigError
from operations import release
from resolve.neighbours import ALL, check, read_launcher

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def rendered_launcher(args: list[str], env: dict[str, str]) -> str:
    """A launcher exactly as deploy.py renders it."""
    return get_template(str(TEMPLATES / "serve.sh.j2")).render(
        deployment="other", repo="heavylift/tiny-llama", commit="a" * 40,
        env_file="/opt/heavylift/deployments/other/private/serve.env", relative=True,
        env_lines=[f"{key}={shlex.quote(value)}" for key, value in sorted(env.items())],
        command_lines=release.launcher_lines(
            ["/opt/heavylift/deployments/other/venv/bin/vllm", "serve", "/opt/heavylift/deployments/other/overlay",
             "--served-model-name", "x y", "--host", "0.0.0.0", *args],
            {"/opt/heavylift/deployments/other/venv": "venv", "/opt/heavylift/deployments/other/overlay": "overlay"},
        ),
    )


@pytest.mark.parametrize(
    "args, env, port, gpus, fraction",
    [
        (["--port", "8001", "--gpu-memory-utilization", "0.3"], {"CUDA_VISIBLE_DEVICES": "0", "HF_HUB_OFFLINE": "1"},
         8001, (0,), 0.3),
        (["--port", "9000"], {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 9000, (4, 5, 6, 7), None),
        (["--port", "8000"], {"HF_HUB_OFFLINE": "1"}, 8000, ALL, None),
        (["--port=8002", "--gpu-memory-utilization=0.55"], {"CUDA_VISIBLE_DEVICES": ""}, 8002, None, 0.55),
    ],
    ids=["one-gpu-fraction", "four-gpus", "all-gpus", "equals-forms-no-gpu"],
)
def test_read_launcher_as_rendered(args, env, port, gpus, fraction):
    neighbour = read_launcher("other", "/x/serve", rendered_launcher(args, env))
    assert (neighbour.port, neighbour.gpus, neighbour.memory_fraction) == (port, gpus, fraction)


def ours(port=8000, gpus=None, extra_args=()):
    settings = SimpleNamespace(root="/opt/heavylift", port=port, gpus=gpus, extra_args=list(extra_args))
    return SimpleNamespace(name="tiny", settings=settings, entry=SimpleNamespace(serve=SimpleNamespace(extra_args=[])))


def on_host(listening=(), **launchers):
    """The HostNeighbours fact: ``other=(args, env)`` for other/serve."""
    return {"launchers": {f"{name}/serve": rendered_launcher(*spec) for name, spec in launchers.items()},
            "listening": list(listening)}


def refusal(deployment, found, gpu_count=2) -> str:
    with pytest.raises(HeavyliftConfigError) as refused:
        check(deployment, "h1", gpu_count, lambda key: f"site.py ({key})", found)
    return str(refused.value)


def test_a_port_another_deployment_serves_on_is_refused_naming_it():
    message = refusal(ours(8001, gpus=[1]), on_host(other=(["--port", "8001"], {"CUDA_VISIBLE_DEVICES": "0"})))
    assert message.startswith("site.py (port), host 'h1': field 'port': port 8001 is already served by deployment "
                              "'other' on this host (/opt/heavylift/deployments/other/serve).")
    assert message.endswith("No host was changed.")


def test_a_port_something_else_listens_on_is_refused_unless_it_is_our_own_vllm():
    assert "something other than a heavylift deployment already listens on port 8000" in refusal(
        ours(8000), on_host(listening=[8000]))
    check(ours(8000), "h1", 2, str, {"launchers": {"tiny/serve": rendered_launcher(["--port", "8000"], {})},
                                      "listening": [8000]})


def test_a_gpu_is_shared_only_with_fractions_that_add_up_to_at_most_one():
    other = (["--port", "8001", "--gpu-memory-utilization", "0.55"], {"CUDA_VISIBLE_DEVICES": "0"})
    assert "field 'gpus': GPU 0 is already used by deployment 'other'" in refusal(ours(gpus=[0]), on_host(other=other))
    assert "add up to 1.05, more than the GPU has" in refusal(
        ours(gpus=[0], extra_args=["--gpu-memory-utilization", "0.5"]), on_host(other=other))
    check(ours(gpus=[0], extra_args=["--gpu-memory-utilization", "0.3"]), "h1", 2, str, on_host(other=other))
    check(ours(gpus=[1]), "h1", 2, str, on_host(other=other))  # GPUs of its own
