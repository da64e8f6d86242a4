"""A converged re-run's wheelhouse step, before and after, side by side (run from the repository root):

    .venv/bin/python benchmarks/bench_wheelhouse.py [--megabytes 700] [--rounds 3] [--keep DIR]

The GPU site (inventory/h200.py) uploads a ~700 MB wheelhouse (``vllm.wheelhouse_upload``). Its step was
pyinfra's ``files.sync``, which hashes every wheel on the control machine and again on the host on every
run (pyinfra 3.10 operations/files.py ``_file_equal``); it is now ``runtime.wheelhouse_uploaded``, which
stats the wheels and reads their kept digests (resolve/wheelhouse.py). The benchmark writes a synthetic
wheelhouse of that size (random bytes in stored zips: one 300 MB "vllm" wheel and 5 MB ones, as the
real one is shaped), converges it once, then times whole `pyinfra -y @local` runs of one step, in turns:

  sync-same   files.sync, the host folder the same as the local one (the H200 site: @local, one folder)
  ours-same   wheelhouse_uploaded, the same
  sync-copy   files.sync into another folder that holds a converged copy (a remote host's case)
  ours-copy   wheelhouse_uploaded, the same

Figures: median wall seconds of each (min-max), and the ratios sync/ours. Every run must report no change.
The wheelhouse and the plan cache live in a temporary folder (``--keep`` names one to reuse).

Measured 2026-12-06 on the 2-core development machine while other test runs loaded it (load 5-7), 734 MB
in 81 wheels, 3 rounds: sync-same 10.64 s (10.56-17.51), ours-same 1.68 s (1.15-2.11): 6.3x; sync-copy
14.61 s (12.52-15.82), ours-copy 1.37 s (0.99-1.70): 10.7x. A run of one files.directory on a folder that
exists took 1.08-1.41 s right after: ours is pyinfra's own cost.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYINFRA = str(Path(sys.executable).parent / "pyinfra")

DEPLOY = """
import sys
sys.path.insert(0, {repo!r})
from pyinfra.operations import files
from operations import runtime
if {ours!r}:
    runtime.wheelhouse_uploaded(name="wheelhouse (uploaded)", src={src!r}, dest={dest!r})
else:
    files.sync(name="wheelhouse (uploaded)", src={src!r}, dest={dest!r})
"""


def write_wheelhouse(folder: Path, megabytes: int) -> None:
    """Stored (uncompressed) zips of random bytes: nothing a hash or a copy can skip."""
    folder.mkdir(parents=True, exist_ok=True)
    sizes = [min(300, megabytes)] + [5] * max(0, (megabytes - 300) // 5)
    for index, size in enumerate(sizes):
        name = "vllm-0.26.0-cp38-abi3-manylinux_2_31_x86_64.whl" if index == 0 else f"dep{index:03d}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(folder / name, "w", zipfile.ZIP_STORED) as wheel:
            with wheel.open("data.bin", "w") as data:
                for _ in range(size):
                    data.write(os.urandom(1 << 20))
    old = time.time() - 3600  # written an hour ago, as a wheelhouse built before the run is
    for path in folder.iterdir():
        os.utime(path, (old, old))


def run(work: Path, name: str, ours: bool, src: Path, dest: Path, env: dict) -> tuple[float, str]:
    deploy = work / f"{name}.py"
    deploy.write_text(DEPLOY.format(repo=str(REPO), ours=ours, src=str(src), dest=str(dest)))
    started = time.monotonic()
    done = subprocess.run([PYINFRA, "-y", "@local", str(deploy)], cwd=work, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{name}: pyinfra failed\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return seconds, done.stdout + done.stderr


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--megabytes", type=int, default=700)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", default="")
    args = parser.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="hl-bench-wheelhouse-"))
    work.mkdir(parents=True, exist_ok=True)
    src, copy = work / "wheelhouse", work / "host-copy"
    env = {**os.environ, "HEAVYLIFT_CACHE": str(work / "cache")}
    try:
        if not src.exists():
            started = time.monotonic()
            write_wheelhouse(src, args.megabytes)
            print(f"wrote {sum(p.stat().st_size for p in src.iterdir()) / 1e6:.0f} MB in "
                  f"{len(list(src.iterdir()))} wheels ({time.monotonic() - started:.1f} s)")
        cases = {"sync-same": (False, src), "ours-same": (True, src), "sync-copy": (False, copy),
                 "ours-copy": (True, copy)}
        # converge: the copy made once (by our operation: it writes the record), then each case once unmeasured
        run(work, "converge", True, src, copy, env)
        for name, (ours, dest) in cases.items():
            run(work, name, ours, src, dest, env)
        figures = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, (ours, dest) in cases.items():
                seconds, output = run(work, name, ours, src, dest, env)
                # pyinfra's results table: the step on 1 host, no success (a change), no error, 1 no change
                if not re.search(r"wheelhouse \(uploaded\)\s+1\s+-\s+-\s+1\s", output):
                    raise SystemExit(f"{name}: the converged wheelhouse step did not report 'No change'\n{output[-2000:]}")
                figures[name].append(seconds)
        print(f"{args.rounds} rounds, whole `pyinfra -y @local` runs of the wheelhouse step, wall seconds:")
        for name, values in figures.items():
            print(f"  {name:10s} median {statistics.median(values):6.2f}  (min {min(values):.2f}, max {max(values):.2f})")
        for where in ("same", "copy"):
            before, after = statistics.median(figures[f"sync-{where}"]), statistics.median(figures[f"ours-{where}"])
            print(f"  {where}: files.sync / wheelhouse_uploaded = {before:.2f} / {after:.2f} = {before / after:.1f}x")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
