"""An upgrade of a serving fleet under client traffic, through heavylift's real CLI, two ways side by side:
all hosts at once (no wave setting) and rolling (``max_unavailable: 1``). Three SSH test hosts serve the tiny
model with vLLM's CPU build (the start-stop-daemon fallback); each upgrade changes one flag, so every host
restarts into a new release. Run as root from the repository root, under the shared lock:

    flock /tmp/heavylift-e2e.lock .venv/bin/python benchmarks/bench_rolling.py [--streams 2] [--tokens 16] [--pause 0.5]

While each upgrade runs, ``--streams`` clients send streamed completions of ``--tokens`` tokens round robin to
every host (testbed/traffic.py) and ``/health`` of each host is sampled every 100 ms. Printed per upgrade:
requests sent, ok, refused (no answer began: connection refused or reset, or an error status while vLLM drains), broken
(an answer began and stopped short), the most hosts out at once
and the longest time a host was out; the run's wall time. The same machine, the same hosts, one run.

Needs the shared uv cache the e2e tests fill (tests/conftest.py warm_uv_cache: run one e2e test first) and,
where download.pytorch.org is out of reach, HEAVYLIFT_WHEELS (a folder holding torch 2.13.0+cpu).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from conftest import SHARED_UV_CACHE, VLLM_CPU, one_core_each  # noqa: E402
from testbed.hub_mirror import HubMirror, publish_repo  # noqa: E402
from testbed.ssh_hosts import TestBed, find_free_port  # noqa: E402
from testbed.tiny_model import write_tiny_llama  # noqa: E402
from testbed.traffic import Traffic  # noqa: E402

PYINFRA = str(Path(sys.executable).parent / "pyinfra")
NAMES = ("host1", "host2", "host3")
SHUTDOWN_TIMEOUT = 20


def deploy(inventory: Path) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run([PYINFRA, "-y", str(inventory), "deploy.py"], cwd=REPO, capture_output=True, text=True,
                          timeout=1800)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"pyinfra failed:\n{output[-6000:]}")
    return time.monotonic() - started, output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=2, help="concurrent clients")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per streamed completion")
    parser.add_argument("--pause", type=float, default=0.5, help="each client's wait between its requests")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the SSH test hosts need root")
    if not Path(SHARED_UV_CACHE).is_dir():
        raise SystemExit(f"{SHARED_UV_CACHE} is missing: run an e2e test once (tests/conftest.py warm_uv_cache)")
    work = Path(tempfile.mkdtemp(prefix="heavylift-bench-rolling-"))
    write_tiny_llama(work / "tiny-llama")
    publish_repo(work / "mirror", "heavylift/tiny-llama", work / "tiny-llama")
    ports: dict[str, int] = {}
    for name in NAMES:
        while (port := find_free_port()) in ports.values():
            pass
        ports[name] = port
    cores = one_core_each(NAMES)  # each host's engine on a core of its own, as separate machines have
    bed = TestBed(work / "bed", names=list(NAMES))
    rows = []
    try:
        with HubMirror(work / "mirror") as mirror:
            inventory = work / "site.py"

            def write(extra_args: list[str], **site) -> None:
                bed.write_inventory(inventory, host_data={name: {
                    "model": "tiny-llama", "root": "/opt/heavylift", "port": ports[name], "hf_endpoint": mirror.url,
                    "uv_cache_dir": SHARED_UV_CACHE, "vllm": VLLM_CPU, "readiness_timeout": 900,
                    "service_manager": "fallback", "shutdown_timeout": SHUTDOWN_TIMEOUT, "benchmark_tokens": 0,
                    "extra_args": extra_args, "env": cores[name], **site} for name in NAMES})

            write([])
            first, _ = deploy(inventory)
            print(f"first converge of {len(NAMES)} hosts: {first:.0f} s", flush=True)
            endpoints = {name: f"http://127.0.0.1:{ports[name]}" for name in NAMES}
            for label, flag, site in (("all at once", "3", {}), ("rolling, max_unavailable 1", "2", {"max_unavailable": 1})):
                write(["--max-num-seqs", flag], **site)
                with Traffic(endpoints, model="heavylift/tiny-llama", streams=args.streams, max_tokens=args.tokens,
                             pause=args.pause) as load:
                    time.sleep(5)
                    wall, _ = deploy(inventory)
                    time.sleep(5)
                report = load.report()
                longest = report.longest_outage
                rows.append((label, wall, report, longest))
                print(f"{label}: deploy run {wall:.0f} s; {report.describe()}", flush=True)
    finally:
        bed.stop()
    print(f"\nvllm-cpu {VLLM_CPU['version']}, tiny-llama, {len(NAMES)} SSH test hosts on one machine of "
          f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}; {args.streams} streams of {args.tokens} tokens "
          f"{args.pause} s apart, "
          f"--shutdown-timeout {SHUTDOWN_TIMEOUT}")
    print("| upgrade | deploy run (s) | requests | ok | refused | broken | "
          "most hosts out at once | longest out (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for label, wall, report, longest in rows:
        print(f"| {label} | {wall:.0f} | {len(report.requests)} | {len(report.of('ok'))} | {len(report.of('refused'))} | "
              f"{len(report.of('broken'))} | {report.max_out_at_once} | "
              f"{longest.seconds if longest else 0:.1f} |")


if __name__ == "__main__":
    main()
