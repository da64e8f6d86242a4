"""End to end: the real pyinfra CLI over real SSH converges two test hosts, each downloading the
tiny model from a real Hub mirror and serving it with real vLLM (CPU build); then a second run
changes nothing, a dry run with --diff shows a change without making it, and the change applied
restarts only the host it touches.
"""

import json
import re
import shutil
import urllib.request

import pytest

from conftest import REPO_ROOT, TEST_ROOT, run_pyinfra, tiny_site_data
from testbed.ssh_hosts import find_free_port

pytestmark = pytest.mark.e2e

# the test hosts share this machine's network: each host's vLLM gets a port of its own
PORTS = {"host1": find_free_port(), "host2": find_free_port()}
while PORTS["host2"] == PORTS["host1"]:
    PORTS["host2"] = find_free_port()
ROOT = TEST_ROOT
PIDFILE = f"{ROOT}/deployments/tiny-llama/run/serve.pid"


def site_data(mirror_url, uv_cache, **overrides):
    return tiny_site_data(mirror_url, uv_cache, readiness_timeout=900, **overrides)


def complete(port, prompt="Hello"):
    body = json.dumps({"model": "heavylift/tiny-llama", "prompt": prompt, "max_tokens": 4, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.load(answer)


def read_pid(host):
    return int(host.run(f"cat {PIDFILE}").stdout.strip())


@pytest.fixture(scope="module")
def site(testbed_factory, hub_mirror, warm_uv_cache, tmp_path_factory):
    """Two SSH test hosts, converged once by a real run; tests below share it."""
    assert not shutil.os.path.exists(ROOT), f"{ROOT} exists on this machine: the isolation check would prove nothing"
    bed = testbed_factory(["host1", "host2"])
    inventory = tmp_path_factory.mktemp("site") / "site.py"

    def write(overrides_by_host=None):
        overrides_by_host = overrides_by_host or {}
        bed.write_inventory(
            inventory,
            host_data={
                name: site_data(hub_mirror.url, warm_uv_cache, port=port, **overrides_by_host.get(name, {}))
                for name, port in PORTS.items()
            },
        )

    write()
    first = run_pyinfra(inventory)
    return {"bed": bed, "inventory": inventory, "write": write, "first": first}


def test_first_run_converges_and_serves(site, hub_mirror):
    first = site["first"]
    assert first.returncode == 0, first.output[-4000:]
    bed = site["bed"]
    commit = hub_mirror.commits["heavylift/tiny-llama"]
    for name, port in PORTS.items():
        host = bed[name]
        assert f"[{name}] vLLM healthy after" in first.output
        assert f"serving heavylift/tiny-llama at http://127.0.0.1:{port}/v1" in first.output
        content = f"{ROOT}/models/heavylift--tiny-llama/{commit}"
        manifest = json.loads(host.run(f"cat {content}.manifest.json").stdout)
        assert manifest["commit"] == commit
        assert "model.safetensors.index.json" in manifest["files"]
        # the overlay links to the pristine download and holds the rendered config
        overlay = f"{ROOT}/deployments/tiny-llama/overlay"
        shard = next(name for name in manifest["files"] if name.endswith(".safetensors"))
        assert host.run(f"readlink {overlay}/{shard}").stdout.strip() == f"{content}/{shard}"
        assert json.loads(host.run(f"cat {overlay}/config.json").stdout)["architectures"] == ["LlamaForCausalLM"]
        # vLLM really answers, on the port this host was given
        reply = complete(port)
        assert reply["model"] == "heavylift/tiny-llama" and reply["choices"][0]["text"]
        assert host.run(f"kill -0 {read_pid(host)}").returncode == 0
    # everything landed in the hosts' own roots, nothing on this machine
    assert not shutil.os.path.exists(ROOT)


def test_second_run_changes_nothing_and_restarts_nothing(site):
    bed = site["bed"]
    pids = {name: read_pid(bed[name]) for name in PORTS}
    second = run_pyinfra(site["inventory"])
    assert second.returncode == 0, second.output[-4000:]
    assert second.changed_operations() == [], second.output[-4000:]
    results = second.operation_results()
    assert len(results) >= 12 and all(row[3] == "2" for row in results.values()), results
    assert {name: read_pid(bed[name]) for name in PORTS} == pids


def test_dry_diff_shows_the_change_and_makes_none(site):
    bed = site["bed"]
    launcher = f"{ROOT}/deployments/tiny-llama/serve"
    before = bed["host1"].run(f"cat {launcher}").stdout
    pid = read_pid(bed["host1"])
    site["write"]({"host1": {"max_model_len": 128}})
    dry = run_pyinfra(site["inventory"], "--dry", "--diff")
    assert dry.returncode == 0, dry.output[-4000:]
    assert re.search(r"^\s*-\s+--max-model-len 256 \\$", dry.output, re.M), dry.output[-4000:]
    assert re.search(r"^\s*\+\s+--max-model-len 128 \\$", dry.output, re.M), dry.output[-4000:]
    # the plan names the restart that applying it would cause, on host1 only
    assert re.search(r"service \(start-stop-daemon\)\s+1 \(host1\)", dry.output), dry.output[-4000:]
    assert bed["host1"].run(f"cat {launcher}").stdout == before
    assert read_pid(bed["host1"]) == pid


def test_dry_diff_shows_config_patch_and_unit(site, tmp_path):
    """A catalog patch shows as a JSON diff of the overlay's config.json, a systemd site as its unit."""
    bed = site["bed"]
    catalog = tmp_path / "catalog"
    shutil.copytree(REPO_ROOT / "models", catalog, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    entry = (catalog / "tiny-llama.yaml").read_text()
    assert "config_patch" not in entry
    (catalog / "tiny-llama.yaml").write_text(
        entry + "config_patch:\n  reason: test\n  config_json:\n    set:\n      max_position_embeddings: 1024\n"
    )
    overlay_config = f"{ROOT}/deployments/tiny-llama/overlay/config.json"
    before = bed["host1"].run(f"cat {overlay_config}").stdout
    dry = run_pyinfra(
        site["inventory"], "--dry", "--diff", "--data", "service_manager=systemd", env={"HEAVYLIFT_CATALOG": str(catalog)}
    )
    assert dry.returncode == 0, dry.output[-4000:]
    assert re.search(r'^\s*-\s+"max_position_embeddings": 2048,$', dry.output, re.M), dry.output[-6000:]
    assert re.search(r'^\s*\+\s+"max_position_embeddings": 1024,$', dry.output, re.M), dry.output[-6000:]
    assert "ExecStart=/opt/heavylift/deployments/tiny-llama/current/serve" in dry.output, dry.output[-6000:]
    assert bed["host1"].run(f"cat {overlay_config}").stdout == before
    assert bed["host1"].run("test -e /etc/systemd/system/heavylift-tiny-llama.service").returncode != 0


def test_applied_change_restarts_only_the_host_it_touches(site):
    bed = site["bed"]
    pids = {name: read_pid(bed[name]) for name in PORTS}
    site["write"]({"host1": {"max_model_len": 128}})
    applied = run_pyinfra(site["inventory"])
    assert applied.returncode == 0, applied.output[-4000:]
    assert "[host1] vLLM healthy after" in applied.output
    assert read_pid(bed["host1"]) != pids["host1"]
    assert read_pid(bed["host2"]) == pids["host2"]
    assert "--max-model-len 128" in bed["host1"].run(f"cat {ROOT}/deployments/tiny-llama/serve").stdout
    assert complete(PORTS["host1"])["choices"][0]["text"]
