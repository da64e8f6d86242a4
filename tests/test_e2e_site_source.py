"""End to end, weights fetched once per site (no vLLM): three SSH test hosts, ``site_source`` naming
src1. The real pyinfra CLI runs deploy.py's planning and weights stage (operations/rollout.py's
planned and weights_present, from a small deploy file that skips the vLLM venv) against an upstream Hub stand-in that counts the bytes it sends
(benchmarks/static_hub.py):

(a) one run: src1 fetches from the upstream and serves its verified snapshot
    (site_source_server.py under start-stop-daemon, as the service user, behind the site's token);
    peer1 and peer2 copy it from src1; the upstream sent the checkpoint's bytes once (1x, not 3x);
    every host's files and manifest match the upstream's sha256; the token is in no output;
(b) a re-run changes nothing and the upstream sends nothing;
(c) a half-fetched snapshot on the source (its manifest gone, a shard cut short, a partial file
    beside it, as a fetch in progress leaves it) is never served: the source answers 404 for it,
    a copying host waits, fails naming the source and takes none of its bytes; the next full run
    completes the source from the upstream (only the missing bytes) and then the peer.
"""

import json
import os
import re

import pytest

from conftest import REPO_ROOT, SHARED_UV_CACHE, VLLM_CPU, run_pyinfra, uv_binary
from operations import runtime

pytestmark = pytest.mark.e2e

ROOT = "/opt/heavylift"
TOKEN = "hf_sitesourcetesttoken4242"
SHARDS = {f"model-extra-0000{i}-of-00002.safetensors": 6 << 20 for i in (1, 2)}

DEPLOY = f'''
import sys
sys.path.insert(0, {str(REPO_ROOT)!r})

from operations import rollout, runtime

# deploy.py's planning and weights stage, as they are there, with only the Hub client's venv before them
plan, context = rollout.planned()
layout, part = plan.layout, plan.runtime
runtime.uv(name=f"uv {{part.uv_version}}", path=layout.uv, version=part.uv_version)
runtime.venv(
    name="Hub client venv", path=part.hub_venv.path, spec=part.hub_venv.spec,
    uv_path=layout.uv, uv_cache=layout.uv_cache, check=part.hub_venv.check,
)
rollout.weights_present(plan, rollout.disk_checked(plan))
'''


@pytest.fixture(scope="session")
def hub_client_cache(tmp_path_factory):
    """huggingface_hub (the hosts' Hub client venv) in the shared uv cache: the hosts install it from disk."""
    import subprocess

    uv = uv_binary()
    venv = tmp_path_factory.mktemp("hub-warm") / "venv"
    env = {**os.environ, "UV_CACHE_DIR": SHARED_UV_CACHE, "UV_PYTHON_DOWNLOADS": "never"}
    subprocess.run([uv, "venv", "--quiet", "--python", "python3", str(venv)], env=env, check=True)
    subprocess.run([uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), "huggingface_hub==2.4.0"],
                   env=env, check=True)
    return SHARED_UV_CACHE


@pytest.fixture(scope="module")
def site(testbed_factory, hub_client_cache, tmp_path_factory):
    from benchmarks.static_hub import StaticHub
    from testbed.tiny_model import write_tiny_llama

    from testbed.ssh_hosts import find_free_port

    bed = testbed_factory(["src1", "peer1", "peer2"])
    port = find_free_port()
    folder = tmp_path_factory.mktemp("site-source")
    published = folder / "published"
    write_tiny_llama(published)
    for name, size in SHARDS.items():
        (published / name).write_bytes(os.urandom(size))
    inventory, deploy = folder / "site.py", folder / "site_source_deploy.py"
    deploy.write_text(DEPLOY)
    with StaticHub(published, "heavylift/tiny-llama", "6" * 40) as upstream:
        def write(**overrides):
            data = {"model": "tiny-llama", "root": ROOT, "hf_endpoint": upstream.url, "uv_cache_dir": hub_client_cache,
                    "vllm": VLLM_CPU, "disk_margin_gb": 0, "hf_token": "env:HEAVYLIFT_TEST_HF_TOKEN",
                    "download_workers": 4, "service_manager": "fallback",
                    "site_source": {"host": "src1", "port": port, "bind_address": "127.0.0.1", "wait_seconds": 3},
                    **overrides}
            bed.write_inventory(inventory, host_data={name: data for name in bed.hosts})

        write()
        content = f"{ROOT}/models/heavylift--tiny-llama/{upstream.commit}"
        control_cache = folder / "control-cache"
        control_cache.mkdir()
        # uv's binary for the hosts, as every test run keeps it (operations/runtime.py LOCAL_CACHE): no PyPI request
        (runtime.LOCAL_CACHE / "uv").mkdir(parents=True, exist_ok=True)
        (control_cache / "uv").symlink_to(runtime.LOCAL_CACHE / "uv")
        yield {"bed": bed, "inventory": inventory, "deploy": deploy, "upstream": upstream, "content": content,
               "hf_home": str(folder / "control-hf-home"), "control_cache": str(control_cache),
               "manifest": f"{content}.manifest.json", "write": write,
               "port": port}


# what the control machine reads from the upstream while it plans: the model's config (features and rules)
CONTROL_READS = {"config.json"}


def run(site, *args):
    # the control machine's Hub cache (hf_hub_download keys it by repository and commit, not endpoint) and its
    # plan cache are the module's: caches another run filled would hide the planning's read, or not, by chance
    return run_pyinfra(site["inventory"], *args, deploy=str(site["deploy"]), timeout=600,
                       env={"HEAVYLIFT_PROGRESS_SECONDS": "0.5", "HEAVYLIFT_TEST_HF_TOKEN": TOKEN,
                            "HF_HOME": site["hf_home"], "HEAVYLIFT_CACHE": site["control_cache"]})


def snapshot_files(site) -> dict:
    """The upstream's files the catalog entry's allow_patterns take: path -> (size, sha256)."""
    from models.catalog import load_entry
    from operations.weights import matches

    patterns = load_entry("tiny-llama").hub.allow_patterns
    return {path: entry for path, entry in site["upstream"].files.items() if matches(path, patterns)}


def upstream_bytes(site) -> int:
    return sum(site["upstream"].served.values())


def assert_host_matches_upstream(site, name):
    host = site["bed"][name]
    manifest = json.loads(host.run(["cat", site["manifest"]], check=True).stdout)
    expected = {path: sha for path, (_size, sha) in snapshot_files(site).items()}
    assert {path: entry["sha256"] for path, entry in manifest["files"].items()} == expected, name
    listed = host.run(["sh", "-c", f"cd {site['content']} && sha256sum " + " ".join(sorted(expected))], check=True)
    assert {line.split()[1]: line.split()[0] for line in listed.stdout.splitlines()} == expected, name


def test_a_one_run_fetches_once_from_upstream_and_every_host_verifies(site):
    upstream = site["upstream"]
    upstream.reset_counts()
    first = run(site, "-vvv")
    assert first.returncode == 0, first.output[-6000:]
    checkpoint = sum(size for size, _sha in snapshot_files(site).values())
    served = upstream_bytes(site)
    print(f"upstream sent {served} bytes for a {checkpoint}-byte checkpoint and 3 hosts ({served / checkpoint:.2f}x)")
    # every file once, for the source: not once per host; and config.json once more, to the control machine,
    # whose planning reads it (resolve/plan.py) through its own Hub cache, empty here (HF_HOME of the module)
    sizes = {path: size for path, (size, _sha) in snapshot_files(site).items()}
    assert upstream.served == {path: size * (2 if path in CONTROL_READS else 1) for path, size in sizes.items()}
    for name in ("src1", "peer1", "peer2"):
        assert_host_matches_upstream(site, name)
    changed = first.changed_operations()
    assert "site source service (start-stop-daemon)" in changed, changed
    assert any(op.endswith("from the site source src1") for op in changed), changed
    assert re.search(rf"site source src1 \(http://127\.0\.0\.1:{site['port']}\): asking for its verified heavylift/tiny-llama@6{{40}}",
                     first.output), first.output[-4000:]
    assert TOKEN not in first.output
    src1 = site["bed"]["src1"]
    # the server runs as the service user, the token only in its environment (never argv)
    pid = src1.run(["head", "-n", "1", f"{ROOT}/site-source/run/serve.pid"], check=True).stdout.strip()
    status = src1.run(["cat", f"/proc/{pid}/status"], check=True).stdout
    uid = re.search(r"^Uid:\s+(\d+)", status, re.M).group(1)
    assert src1.run(["id", "-u", "heavylift"], check=True).stdout.strip() == uid
    assert TOKEN not in src1.run(["cat", f"/proc/{pid}/cmdline"], check=True).stdout
    for name in ("peer1", "peer2"):
        mode = site["bed"][name].run(["stat", "-c", "%a", f"{ROOT}/deployments/tiny-llama/private/site-source.headers"],
                                     check=True).stdout.strip()
        assert mode == "600"


def test_b_rerun_changes_nothing_and_fetches_nothing(site):
    site["upstream"].reset_counts()
    again = run(site)
    assert again.returncode == 0, again.output[-5000:]
    assert again.changed_operations() == [], again.output[-5000:]
    assert upstream_bytes(site) == 0


def test_c_a_half_fetched_snapshot_on_the_source_is_never_served(site):
    bed, content, manifest = site["bed"], site["content"], site["manifest"]
    src1, peer2 = bed["src1"], bed["peer2"]
    shard = sorted(SHARDS)[0]
    # what a fetch in progress leaves on the source: no manifest, a shard not all there, a partial file
    src1.run(["rm", manifest], check=True)
    src1.run(["truncate", "-s", str(1 << 20), f"{content}/{shard}"], check=True)
    src1.run(["sh", "-c", f"head -c 4096 /dev/urandom > {content}/.cache/huggingface/download/x.incomplete"], check=True)
    base = f"http://127.0.0.1:{site['port']}"
    auth = ["-H", f"Authorization: Bearer {TOKEN}"]
    for path in (f"/heavylift/tiny-llama/resolve/{'6' * 40}/{shard}", f"/heavylift/tiny-llama/resolve/{'6' * 40}/config.json",
                 f"/api/models/heavylift/tiny-llama/tree/{'6' * 40}",
                 f"/heavylift/tiny-llama/resolve/{'6' * 40}/.cache/huggingface/download/x.incomplete"):
        code = peer2.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", *auth, base + path]).stdout
        assert code == "404", (path, code)
    # without the token: nothing at all
    code = peer2.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", base + f"/api/models/heavylift/tiny-llama/tree/{'6' * 40}"]).stdout
    assert code == "401"

    # peer2 lost its copy and runs alone (--limit): it waits for the source, fails naming it, takes nothing
    peer2.run(["rm", "-rf", content, manifest], check=True)
    alone = run(site, "--limit", "peer2")
    assert alone.returncode != 0, alone.output[-5000:]
    assert re.search(rf"the site source src1 \(http://127\.0\.0\.1:{site['port']}\) holds no verified heavylift/tiny-llama@6{{40}} "
                     r"\(HTTP 404\): its own download has not finished, failed, or ran for another commit\. Fix: run the "
                     r"deploy with src1 in it", alone.output), alone.output[-5000:]
    assert peer2.run(["test", "-e", manifest]).returncode != 0
    assert peer2.run(["test", "-e", f"{content}/{shard}"]).returncode != 0

    # the whole site: the source completes from the upstream (the cut shard again, nothing else), then peer2
    site["upstream"].reset_counts()
    healed = run(site, "-vvv")
    assert healed.returncode == 0, healed.output[-6000:]
    assert site["upstream"].served == {shard: SHARDS[shard]}, site["upstream"].served
    assert "removed 1 partial files no run can resume" in healed.output
    for name in ("src1", "peer1", "peer2"):
        assert_host_matches_upstream(site, name)


def test_d_retiring_the_source_hosts_last_deployment_stops_its_server(site):
    """retire.py on src1, whose only deployment is tiny-llama: the site source's server goes with it (stopped, its
    folder gone, its port closed); --dry says so first and changes nothing. The peers keep their copies."""
    from testbed.ssh_hosts import process_is_gone

    src1 = site["bed"]["src1"]
    pid = int(src1.run(["head", "-n", "1", f"{ROOT}/site-source/run/serve.pid"], check=True).stdout)
    # pyinfra pads the host's prefix to the longest name of the inventory ("[src1]  ")
    said = re.compile(r"\[src1\]\s+retire tiny-llama: stop the site source \(fallback, now active\): no deployment is "
                      r"left on this host")

    dry = run_pyinfra(site["inventory"], "--limit", "src1", "--data", "retire=tiny-llama", "--dry", deploy="retire.py")
    assert dry.returncode == 0 and said.search(dry.output), dry.output[-3000:]
    assert re.search(rf"\[src1\]\s+retire tiny-llama: remove {ROOT}/site-source \(the site source's server: launcher, "
                     r"token, log\)", dry.output), dry.output[-3000:]
    assert not process_is_gone(pid)

    gone = run_pyinfra(site["inventory"], "--limit", "src1", "--data", "retire=tiny-llama", deploy="retire.py")
    assert gone.returncode == 0 and said.search(gone.output), gone.output[-3000:]
    assert process_is_gone(pid)
    assert src1.run(f"test -e {ROOT}/site-source").returncode != 0
    assert src1.run(f"test -e {ROOT}/deployments/tiny-llama").returncode != 0
    assert port_refuses(site["port"])
    assert_host_matches_upstream(site, "peer1")  # the copies stay where they were made


def port_refuses(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        probe.settimeout(3)
        return probe.connect_ex(("127.0.0.1", port)) != 0
