"""End to end, the runtime stage alone: the real pyinfra CLI over real SSH installs tiny fake vLLM
builds with real uv from a PEP 503 index on loopback (testbed/wheel_index.py) into a test host,
with the runtime-only deploy (testbed/runtime_deploy.py: validate, build resolution, uv, the vLLM venv,
the link, the GC):

(a) first install of 0.33.0; a re-run changes nothing;
(b) upgrade to 0.34.0 with a one-patch series: `--dry` prints `vLLM 0.33.0 -> 0.34.0 (venv new, 1 patches)`
    and changes nothing; the run builds a new venv beside the old one, patches and checks it, switches;
(c) a patch that does not apply to the build stops the run before any host changes, naming patch, file, hunk;
(d) downgrade to 0.33.0: the kept venv, no install (the index sees no request), only the link moves;
(e) a failed install (0.35.0 needs a torch that does not exist) leaves the host on the old build;
(f) a version the index does not have fails at plan time, saying what it has;
(g) an offline wheelhouse uploaded from the control machine: the install makes no index request at all;
(h) the keep count removes the oldest venv, never the active one;
(i) a host Python's own torch (a GPU image's) reused by the venv (vllm.host_packages): never fetched, imported
    from the image's folder, recorded in the venv's record; a re-run changes nothing;
(j) an image whose torch is not the one the build pins is refused before any host changes.
"""

import json
import re

import pytest

from conftest import REPO_ROOT, run_pyinfra
from testbed.wheel_index import WheelIndex, build_wheel

pytestmark = pytest.mark.e2e

ROOT = "/opt/heavylift"
LINK = f"{ROOT}/deployments/tiny-llama/venv"
PATCH = "tests/fixtures/patches/fake-vllm-0.34.0-marker.patch"

DEPLOY = REPO_ROOT / "testbed" / "runtime_deploy.py"


@pytest.fixture(scope="module")
def site(testbed_factory, tmp_path_factory):
    folder = tmp_path_factory.mktemp("runtime-site")
    index = WheelIndex(folder / "index")
    index.add_pypi("torch", "2.14.0")
    index.add_pypi("torch", "2.13.0")  # an image's older torch (i, j)
    for version in ("0.33.0", "0.34.0"):
        index.add_pypi("vllm", version, requires=("torch==2.14.0",))
    index.add_pypi("vllm", "0.35.0", requires=("torch==9.9.9",))  # no such torch: the install fails
    wheelhouse = folder / "wheelhouse"
    build_wheel(wheelhouse, "vllm", "0.36.0", requires=("torch==2.14.0",))
    build_wheel(wheelhouse, "torch", "2.14.0")
    index.start()
    bed = testbed_factory(["rt1"])
    inventory, deploy = folder / "site.py", DEPLOY

    def write(vllm, **overrides):
        data = {"model": "tiny-llama", "root": ROOT, "vllm": {"index_url": f"{index.url}/pypi/", **vllm}, **overrides}
        bed.write_inventory(inventory, host_data={"rt1": data})

    yield {"bed": bed, "host": bed["rt1"], "inventory": inventory, "deploy": deploy, "write": write, "index": index,
           "wheelhouse": wheelhouse}
    index.stop()


def run(site, *args):
    return run_pyinfra(site["inventory"], *args, deploy=str(site["deploy"]), timeout=300,
                       env={"HEAVYLIFT_LOCK_FILE": str(site["inventory"].with_suffix(".lock.json"))})


def active(site) -> tuple[str, str]:
    """(the link's target, what `vllm --version` prints through the link) on the host."""
    host = site["host"]
    target = host.run(["readlink", LINK]).stdout.strip()
    version = host.run([f"{LINK}/bin/vllm", "--version"]).stdout.strip()
    return target, version


def venvs(site) -> list[str]:
    return sorted(site["host"].run(f"ls {ROOT}/venvs").stdout.split())


def test_a_first_install_then_nothing_to_do(site):
    site["write"]({"version": "0.33.0"})
    first = run(site)
    assert first.returncode == 0, first.output[-5000:]
    assert "vLLM none -> 0.33.0 (venv new, 0 patches)" in first.output
    target, version = active(site)
    assert version == "0.33.0" and re.fullmatch(rf"{ROOT}/venvs/vllm-0\.33\.0-[0-9a-f]{{12}}", target), (target, version)
    second = run(site)
    assert second.returncode == 0 and second.changed_operations() == [], second.output[-5000:]
    assert "vLLM 0.33.0 (active, unchanged, 0 patches)" in second.output
    site["old"] = target


def test_b_upgrade_with_a_patch_series(site):
    site["write"]({"version": "0.34.0", "patches": [PATCH]})
    dry = run(site, "--dry")
    assert dry.returncode == 0, dry.output[-5000:]
    assert "[rt1] vLLM 0.33.0 -> 0.34.0 (venv new, 1 patches)" in dry.output, dry.output[-5000:]
    assert active(site) == (site["old"], "0.33.0")

    upgrade = run(site)
    assert upgrade.returncode == 0, upgrade.output[-5000:]
    target, version = active(site)
    assert version == "0.34.0" and target != site["old"]
    marker = site["host"].run([f"{LINK}/bin/python", "-c", "import vllm; print(vllm.HEAVYLIFT_TEST_PATCH)"])
    assert marker.stdout.strip() == "applied", marker.stderr
    record = json.loads(site["host"].run(["cat", f"{target}/.heavylift-venv.json"]).stdout)
    assert [p["name"] for p in record["patches"]] == ["fake-vllm-0.34.0-marker.patch"]
    assert site["old"] in [f"{ROOT}/venvs/{name}" for name in venvs(site)]  # kept for rollback
    again = run(site)  # the series is recorded: never applied twice
    assert again.returncode == 0 and again.changed_operations() == [], again.output[-5000:]
    site["new"] = target


def test_c_patch_that_does_not_apply_stops_before_any_change(site):
    before = venvs(site)
    site["write"]({"version": "0.33.0", "patches": [PATCH]})
    failed = run(site)
    assert failed.returncode != 0
    assert ("host 'rt1': patch fake-vllm-0.34.0-marker.patch does not apply to vllm 0.33.0: file vllm/__init__.py: "
            "Hunk #1 FAILED at 1") in failed.output, failed.output[-5000:]
    assert "No host was changed." in failed.output
    assert active(site) == (site["new"], "0.34.0") and venvs(site) == before


def test_d_downgrade_switches_to_the_kept_venv_without_install(site):
    site["write"]({"version": "0.33.0"})
    dry = run(site, "--dry")
    assert "[rt1] vLLM 0.34.0 -> 0.33.0 (venv kept, 0 patches)" in dry.output, dry.output[-5000:]
    seen = len(site["index"].requests)
    down = run(site)
    assert down.returncode == 0, down.output[-5000:]
    assert active(site) == (site["old"], "0.33.0")
    assert set(down.changed_operations()) == {"active vLLM venv"}, down.output[-5000:]
    # plan-time resolution reads the project page once; no wheel is fetched, uv never runs
    assert not [r for r in site["index"].requests[seen:] if r.endswith(".whl")]


def test_e_failed_install_leaves_the_old_build_active(site):
    site["write"]({"version": "0.35.0"})
    failed = run(site)
    assert failed.returncode != 0
    assert "heavylift: installing vllm==0.35.0 failed" in failed.output, failed.output[-5000:]
    assert "torch==9.9.9" in failed.output
    assert active(site) == (site["old"], "0.33.0")
    assert not [v for v in venvs(site) if v.startswith("vllm-0.35.0")]  # the half-made venv is gone


def test_f_missing_version_fails_at_plan_time(site):
    site["write"]({"version": "0.34.1"})
    failed = run(site)
    assert failed.returncode != 0
    assert (f"field 'vllm.version': vllm==0.34.1 is not on {site['index'].url}/pypi/vllm/: it has 0.33.0, 0.34.0, "
            "0.35.0") in failed.output, failed.output[-5000:]
    assert active(site) == (site["old"], "0.33.0")


def test_g_offline_wheelhouse_makes_no_index_request(site):
    # the index URL points at a closed port: only the wheelhouse can serve this install
    site["write"]({"version": "0.36.0", "wheelhouse": "/opt/wheelhouse", "wheelhouse_upload": str(site["wheelhouse"]),
                   "index_url": "http://127.0.0.1:9/simple/"})
    seen = len(site["index"].requests)
    offline = run(site)
    assert offline.returncode == 0, offline.output[-5000:]
    assert active(site)[1] == "0.36.0"
    assert site["index"].requests[seen:] == []
    record = json.loads(site["host"].run(["cat", f"{active(site)[0]}/.heavylift-venv.json"]).stdout)
    assert record["wheelhouse"] == "/opt/wheelhouse"


def test_h_keep_count_removes_the_oldest_never_the_active(site):
    # four vLLM venvs now (0.33.0, 0.34.0+patch, 0.36.0 active, and back to 0.34.0 below); keep 2
    site["write"]({"version": "0.34.0", "patches": [PATCH]}, keep_venvs=2)
    result = run(site)
    assert result.returncode == 0, result.output[-5000:]
    left = [v for v in venvs(site) if v.startswith("vllm-")]
    # the active one and the one it replaced (0.36.0) stay; 0.33.0 goes
    assert len(left) == 2, left
    assert f"{ROOT}/venvs/{left[0]}" != site["old"] and f"{ROOT}/venvs/{left[1]}" != site["old"]
    assert active(site) == (site["new"], "0.34.0")
    assert any(v.startswith("vllm-0.36.0") for v in left)


def image_python(site, folder: str, torch: str) -> str:
    """A GPU image's Python on the host: an interpreter (a venv itself, as in NGC or cloud images) that holds torch."""
    uv = f"{ROOT}/bin/uv"
    made = site["host"].run(
        f"UV_PYTHON_DOWNLOADS=never {uv} venv -q --python python3 {folder} && "
        f"{uv} pip install -q --python {folder}/bin/python --index-url {site['index'].url}/pypi/ torch=={torch}"
    )
    assert made.returncode == 0, made.stderr
    return f"{folder}/bin/python3"


def test_i_host_packages_reuse_the_image_torch(site):
    python = image_python(site, "/opt/image-python", "2.14.0")
    site["write"]({"version": "0.34.0", "python": python, "host_packages": ["torch"]})
    seen = len(site["index"].requests)
    result = run(site)
    assert result.returncode == 0, result.output[-5000:]
    assert not [r for r in site["index"].requests[seen:] if "torch" in r]  # the venv's install never asked for torch
    target, version = active(site)
    assert version == "0.34.0"
    imported = site["host"].run([f"{LINK}/bin/python", "-c", "import torch; print(torch.__file__, torch.__version__)"])
    where, torch_version = imported.stdout.split()
    assert where.startswith("/opt/image-python/lib/") and torch_version == "2.14.0", imported.stdout + imported.stderr
    in_venv = site["host"].run(f"ls {target}/lib/python3*/site-packages").stdout.split()
    assert not [name for name in in_venv if name.startswith("torch")], in_venv
    record = json.loads(site["host"].run(["cat", f"{target}/.heavylift-venv.json"]).stdout)
    assert record["host_packages"]["torch"]["version"] == "2.14.0"
    assert record["host_packages"]["torch"]["site"].startswith("/opt/image-python/lib/")
    again = run(site)
    assert again.returncode == 0 and again.changed_operations() == [], again.output[-5000:]
    site["image_venv"] = target


def test_j_image_torch_other_than_the_pin_is_refused_before_any_change(site):
    python = image_python(site, "/opt/old-image-python", "2.13.0")
    before = venvs(site)
    site["write"]({"version": "0.34.0", "python": python, "host_packages": ["torch"]})
    refused = run(site)
    assert refused.returncode != 0
    assert "field 'vllm.host_packages': the host's torch is 2.13.0" in refused.output, refused.output[-5000:]
    assert "vllm 0.34.0 pins torch==2.14.0" in refused.output
    assert "No host was changed." in refused.output and "Traceback" not in refused.output
    assert venvs(site) == before and active(site)[0] == site["image_venv"]
