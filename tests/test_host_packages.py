"""vllm.host_packages: a GPU image's own torch reused by the vLLM venv (pure parts; the install itself is
proven over SSH in tests/test_e2e_runtime.py (i, j) and on a real H200 by scripts/gpu_proof.sh)."""

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from models.schema import VllmRuntime
from operations import runtime
from resolve import venvs

# vLLM 0.26.0's Requires-Dist lines for torch and friends (its wheel's METADATA)
VLLM_0_26_REQUIRES = [
    "numpy", "transformers>=5.5.3", "torch==2.11.0", "torchaudio==2.11.0", "torchvision==0.26.0",
    'llguidance<1.8.0,>=1.7.0; platform_machine == "x86_64"', "flashinfer-python==0.6.14",
]


def image(torch="2.11.0+cu130"):
    return {"python": "3.12", "packages": {"torch": {"version": torch, "site": "/opt/torch/.venv/lib/python3.12/site-packages"}}}


def test_the_pin_is_read_from_the_builds_requirements():
    assert venvs.pinned_version(VLLM_0_26_REQUIRES, "torch") == "2.11.0"
    assert venvs.pinned_version(VLLM_0_26_REQUIRES, "numpy") is None  # not pinned
    assert venvs.pinned_version(['torch==2.9.1; extra == "cuda"'], "torch") is None  # only with an extra


def test_the_images_cuda_torch_of_the_pinned_version_fits():
    # the local tag (+cu130) is the image's CUDA build of the same release
    assert venvs.host_torch_mismatch(VLLM_0_26_REQUIRES, image("2.11.0+cu130"), "vllm 0.26.0") is None


def test_another_torch_is_named_with_where_it_lives():
    why = venvs.host_torch_mismatch(VLLM_0_26_REQUIRES, image("2.13.0+cu130"), "vllm 0.26.0")
    assert why.startswith("the host's torch is 2.13.0+cu130 (in /opt/torch/.venv/lib/python3.12/site-packages), "
                          "and vllm 0.26.0 pins torch==2.11.0")


def test_an_image_without_torch_is_refused():
    assert "has no torch" in venvs.host_torch_mismatch(VLLM_0_26_REQUIRES, {"packages": {}}, "vllm 0.26.0")


def test_torch_brings_its_triton_along():
    vllm = VllmRuntime(version="0.26.0", host_packages=["torch", "torchvision"])
    assert venvs.host_package_names(vllm) == ["torch", "triton", "torchvision"]


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"host_packages": ["torch==2.11.0"]}, "is not a distribution name"),
        ({"host_packages": ["torch", "Torch"]}, "is listed twice"),
        ({"host_packages": ["torch"], "exclude_packages": ["torch"]}, "in both 'host_packages'"),
    ],
)
def test_bad_host_packages_are_refused(settings, message):
    with pytest.raises(ValidationError, match=message):
        VllmRuntime(version="0.26.0", **settings)


def test_host_packages_change_the_venvs_install_and_name():
    spec = {"python": "python3", "packages": ["vllm==0.26.0"], "index_url": None, "find_links": [], "exclude_packages": []}
    plain = runtime.install_arguments(spec)
    reused = runtime.install_arguments({**spec, "host_packages": {"torch": image()["packages"]["torch"]}})
    assert "--excludes" not in plain and "--excludes" in reused
    assert venvs.venv_name("vllm-0.26.0", spec) != venvs.venv_name("vllm-0.26.0", {**spec, "host_packages": {"torch": {}}})


H200 = Path(__file__).parent / "fixtures" / "h200"


def test_the_lent_h200_images_torch_fits_vllm_0_26_and_not_0_27():
    # read on the GPU machine (scripts/gpu_proof.sh facts, 2026-12-03): the image's Python is a venv of its own
    seen = json.loads((H200 / "image-python.json").read_text())
    packages = {name: {"version": v[0], "site": v[1]} for name, v in seen["packages"].items() if v}
    host = {"python": seen["python"], "packages": packages}
    requires = (H200 / "vllm-0.26.0-requires.txt").read_text().splitlines()  # vllm 0.26.0's wheel METADATA
    assert venvs.host_torch_mismatch(requires, host, "vllm 0.26.0") is None
    # vLLM 0.27+ pins torch 2.13.0 (docs/field-notes.md, "Torch pins of vLLM releases")
    newer = [line.replace("torch==2.11.0", "torch==2.13.0") for line in requires]
    assert "pins torch==2.13.0" in venvs.host_torch_mismatch(newer, host, "vllm 0.28.0")
