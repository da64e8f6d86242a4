"""End to end: `--dry --diff` of a first rollout, on an SSH test host that has never been deployed.

A dry run shows every file heavylift renders, although the host has none of them yet: the launcher,
the environment file (names only, never a value), the systemd unit, the overlay's patched configs,
and what the rules change in the checkpoint's own files (the overlay against the pristine download).
It also prints the rules that fired with their notes, and changes nothing on the host.
"""

import json
import re
import shlex
from pathlib import Path

import pytest

from conftest import SHARED_UV_CACHE, TEST_ROOT, run_pyinfra, tiny_site_data
from rollout_support import SECRET_ENV, SECRET_SOURCES, SECRETS
from testbed.ssh_hosts import find_free_port

pytestmark = pytest.mark.e2e

DEPLOYMENT_DIR = f"{TEST_ROOT}/deployments/tiny-mla"
FIXTURES = Path(__file__).parent / "fixtures"


def fake_nvidia_smi(host, case: str) -> dict:
    """An nvidia-smi on the host's PATH that prints what the fixture's GPUs printed."""
    fixture = json.loads((FIXTURES / "nvidia-smi" / f"{case}.json").read_text())
    printed = fixture["nvidia_smi"]
    version = f"printf %s {shlex.quote(printed['version'])}" if printed["version"] else "exit 6"
    script = (
        "#!/bin/sh\n"
        f'case "$1" in --query-gpu=*) printf %s {shlex.quote(printed["query"])} ;; '
        f"--version) {version} ;; *) printf %s {shlex.quote(printed['table'])} ;; esac\n"
    )
    path = "/usr/local/bin/nvidia-smi"
    written = host.run(f"printf %s {shlex.quote(script)} > {path} && chmod 755 {path}")
    assert written.returncode == 0, written.stderr
    return fixture


def test_dry_diff_of_a_fresh_host_shows_every_planned_file(testbed_factory, hub_mirror, tmp_path):
    bed = testbed_factory(["fresh1"])
    host = bed["fresh1"]
    assert host.run(f"test -e {TEST_ROOT}").returncode != 0
    inventory = tmp_path / "fresh.py"
    data = tiny_site_data(hub_mirror.url, SHARED_UV_CACHE, model="tiny-mla", port=find_free_port(), **SECRET_SOURCES)
    bed.write_inventory(inventory, host_data={"fresh1": data})

    dry = run_pyinfra(inventory, "--dry", "--diff", "--data", "service_manager=systemd", env=SECRET_ENV)
    out = dry.output
    assert dry.returncode == 0, out[-6000:]

    # the rule that fired, and its note
    assert "[fresh1] rule kv-fp8-mla-cpu-strip:" in out, out[-6000:]
    assert "[fresh1] note: 16-bit KV cache: the CPU MLA backends take no FP8 KV cache" in out, out[-6000:]
    # the launcher, the overlay's configs and the resolution, each in full as a new file
    for path in ("serve", "overlay/config.json", "overlay/hf_quant_config.json", "resolution.json"):
        assert f"Will create {DEPLOYMENT_DIR}/{path}" in out, (path, out[-6000:])
    assert re.search(r"^\s*\+\s+--served-model-name heavylift/tiny-mla ", out, re.M), out[-6000:]
    assert re.search(r'^\s*\+\s+"architectures": \[$', out, re.M), out[-6000:]
    # the overlay against the pristine checkpoint: the rule's strip, as a diff
    assert re.search(r"\[fresh1\] overlay config\.json against the pristine heavylift/tiny-mla@[0-9a-f]{12}:$", out, re.M)
    assert re.search(r'^\s*-\s+"kv_cache_scheme": \{$', out, re.M), out[-6000:]
    assert re.search(r'^\s*-\s+"kv_cache_quant_algo": "FP8",?$', out, re.M), out[-6000:]
    # the environment file: its names, never a value
    assert f"Will create {DEPLOYMENT_DIR}/private/serve.env (values not shown)" in out, out[-6000:]
    assert re.search(r"^\s*\+ VLLM_API_KEY=<not shown>$", out, re.M), out[-6000:]
    # vLLM runs offline from the overlay: the HF token is the download's (private/hub.token), never vLLM's
    assert not re.search(r"^\s*\+ HF_TOKEN=", out, re.M), out[-6000:]
    assert not any(secret in out for secret in SECRETS)
    # the unit
    assert f"ExecStart={DEPLOYMENT_DIR}/current/serve" in out, out[-6000:]
    # and nothing on the host
    assert host.run(f"test -e {TEST_ROOT}").returncode != 0
    assert host.run("test -e /etc/systemd/system/heavylift-tiny-mla.service").returncode != 0


def test_glm5_refusal_names_the_hosts_own_gpus(testbed_factory, hub_mirror, tmp_path):
    """The replay's 8x H200 host: the refusal names its GPUs (sm90), not the rollout's SM120, and says
    that no host was changed."""
    bed = testbed_factory(["h200"])
    host = bed["h200"]
    fixture = fake_nvidia_smi(host, "h200-x8")
    inventory = tmp_path / "glm.py"
    bed.write_inventory(inventory, host_data={"h200": tiny_site_data(hub_mirror.url, SHARED_UV_CACHE, model="glm-5")})

    dry = run_pyinfra(inventory, "--dry", "--diff")
    out = dry.output
    assert dry.returncode != 0 and "Traceback" not in out, out[-4000:]
    assert fixture["summary"].startswith("8x NVIDIA H200 (sm90, ")
    assert f"model 'glm-5' is not supported by heavylift (chosen for host 'h200' ({fixture['summary']}) in {inventory})" in out, out[-4000:]
    assert "no vLLM release serves this checkpoint, on any GPU" in out and "No host was changed." in out, out[-4000:]
    assert host.run(f"test -e {TEST_ROOT}").returncode != 0
