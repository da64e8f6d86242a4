"""Tensor parallel on vLLM's CPU build, through heavylift's real CLI: one SSH test host serving tiny-llama-tp8
at each tensor parallel size in turn (as root, from the repository root, under the shared lock):

    flock /tmp/heavylift-e2e.lock .venv/bin/python benchmarks/bench_tp.py [--sizes 1,2,8]

For each size the site's ``tensor_parallel_size`` changes and ``deploy.py`` restarts vLLM into a new release;
heavylift's readiness gate measures the start (load: process start to /health), the time to the first token
of a completion and a streamed decode of ``--tokens`` tokens, and writes them to status.json, which this
script reads. Beside them: the processes of the service user (API server, engine core, one worker per rank)
with their summed resident memory, the /dev/shm bytes its ranks hold, and the whole run's wall time. Each
size's gate is its own start, measured the same way, in one run of this script on one machine.

Needs the shared uv cache the e2e tests fill (tests/conftest.py warm_uv_cache: run one e2e test first) and,
where download.pytorch.org is out of reach, HEAVYLIFT_WHEELS (a folder holding torch 2.13.0+cpu).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from conftest import SHARED_UV_CACHE, VLLM_CPU  # noqa: E402
from testbed.hub_mirror import HubMirror, publish_repo  # noqa: E402
from testbed.ssh_hosts import TestBed, find_free_port  # noqa: E402
from testbed.tiny_model import write_tiny_llama_tp8  # noqa: E402

PYINFRA = str(Path(sys.executable).parent / "pyinfra")
ROOT = "/opt/heavylift"
STATUS = f"{ROOT}/deployments/tiny-llama-tp8/status.json"


def service_processes(host) -> list[tuple[int, str, int]]:
    """(pid, title, RSS KiB) of every process of the service user on the host."""
    listed = host.run(["ps", "-u", "heavylift", "-o", "pid=,rss=,args="]).stdout
    found = []
    for line in listed.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3:
            found.append((int(parts[0]), parts[2][:60], int(parts[1])))
    return found


def shm_bytes(host) -> int:
    sizes = host.run("find /dev/shm -maxdepth 1 -user heavylift -printf '%s\\n'").stdout.split()
    return sum(int(size) for size in sizes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,2,8", help="tensor parallel sizes, comma-separated, in this order")
    parser.add_argument("--tokens", type=int, default=64, help="tokens of the gate's streamed decode")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the SSH test hosts need root")
    if not Path(SHARED_UV_CACHE).is_dir():
        raise SystemExit(f"{SHARED_UV_CACHE} is missing: run an e2e test once (tests/conftest.py warm_uv_cache)")
    sizes = [int(size) for size in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="heavylift-bench-tp-"))
    write_tiny_llama_tp8(work / "tiny-llama-tp8")
    publish_repo(work / "mirror", "heavylift/tiny-llama-tp8", work / "tiny-llama-tp8")
    port = find_free_port()
    rows = []
    bed = TestBed(work / "bed", names=["tp"])
    try:
        with HubMirror(work / "mirror") as mirror:
            inventory = work / "site.py"
            for size in sizes:
                bed.write_inventory(inventory, host_data={"tp": {
                    "model": "tiny-llama-tp8", "tensor_parallel_size": size, "root": ROOT, "port": port,
                    "hf_endpoint": mirror.url, "uv_cache_dir": SHARED_UV_CACHE, "vllm": VLLM_CPU,
                    "readiness_timeout": 1200, "benchmark_tokens": args.tokens, "service_manager": "fallback",
                }})
                started = time.monotonic()
                done = subprocess.run([PYINFRA, "-y", str(inventory), "deploy.py"], cwd=REPO, capture_output=True,
                                      text=True, timeout=1800)
                wall = time.monotonic() - started
                output = done.stdout + done.stderr
                if done.returncode != 0:
                    raise SystemExit(f"TP {size}: pyinfra failed:\n{output[-6000:]}")
                bind = re.search(r"VLLM_CPU_OMP_THREADS_BIND=(\S+)", output)
                status = json.loads(bed["tp"].run(f"cat {STATUS}").stdout)
                processes = service_processes(bed["tp"])
                rows.append({
                    "tp": size, "wall_s": round(wall, 1), "load_s": status["load_seconds"],
                    "ttft_s": status["ttft_seconds"], "decode_tok_s": status["tokens_per_second"],
                    "decode_note": status.get("decode_note"),
                    "processes": len(processes), "workers": sum("Worker_TP" in title for _, title, _ in processes),
                    "rss_mib": round(sum(rss for _, _, rss in processes) / 1024), "shm_mib": round(shm_bytes(bed["tp"]) / 2**20),
                    "bind": bind.group(1) if bind else "auto (TP 1)",
                })
                print(json.dumps(rows[-1]), flush=True)
    finally:
        bed.stop()
    print(f"\nvllm-cpu {VLLM_CPU['version']}, tiny-llama-tp8 (8 heads, hidden 256, 2 layers), "
          f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}; gate decode of {args.tokens} tokens, one stream")
    print("| TP | deploy run (s) | load (s) | TTFT (s) | decode (tok/s) | processes (workers) | RSS (MiB) | /dev/shm (MiB) | binding |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        decode = row["decode_tok_s"] if row["decode_tok_s"] is not None else f"- ({row['decode_note']})"
        print(f"| {row['tp']} | {row['wall_s']} | {row['load_s']} | {row['ttft_s']} | {decode} | "
              f"{row['processes']} ({row['workers']}) | {row['rss_mib']} | {row['shm_mib']} | {row['bind']} |")
    base = next((row for row in rows if row["tp"] == 1), None)
    if base and base["decode_tok_s"]:
        for row in rows:
            if row["tp"] != 1 and row["decode_tok_s"]:
                print(f"TP {row['tp']} / TP 1: load {row['load_s'] / base['load_s']:.2f}x, "
                      f"decode {row['decode_tok_s'] / base['decode_tok_s']:.2f}x")


if __name__ == "__main__":
    main()
