"""Weights benchmarks, measured side by side in one run on this machine (loopback mirror).

    .venv/bin/python benchmarks/bench_weights.py [--data-gb 2] [--rounds 3] [--only download,recheck,verify]

1. download: heavylift's host script (fetch_weights.py: huggingface_hub in a watched child, then
   sha256 of every file against the listing's LFS sha256, and the manifest) vs `hf download` of the
   same files vs raw parallel curl of the same URLs (the ceiling), all from one loopback server
   (benchmarks/static_hub.py: olah serves blobs through `git cat-file` and would be what is timed).
   Real random data (--data-gb).
2. recheck: a converged 119-shard, 540 GB checkpoint (SPARSE files: apparent size only) re-checked
   by a pyinfra run of weights.downloaded on @local vs a pyinfra run that does nothing; shard bytes
   read (every shard's atime set in the past first: a read would move it).
3. verify: verify_weights.hash_files (all cores) vs `sha256sum` of the same files one after
   another, real data (--data-gb, from the page cache); the full re-hash of 540 GB is extrapolated
   from this rate (said so in the output).
Figures are medians of --rounds runs, the commands taking turns (A B C A B C ...).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "operations" / "scripts"))

from benchmarks.static_hub import StaticHub  # noqa: E402

BIN = Path(sys.executable).parent
REPO = "heavylift/bench-weights"


def timed(command: list[str], env: dict | None = None, cwd: Path | None = None) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(command, env={**os.environ, **(env or {})}, cwd=cwd, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{command[0]} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return seconds, done.stdout + done.stderr


def median(values: list[float]) -> float:
    return statistics.median(values)


def line(name: str, seconds: float, gb: float, ratio_to: float | None = None, ratio_label: str = "") -> str:
    text = f"  {name:<44} {seconds:8.2f} s  {gb / seconds:7.3f} GB/s"
    if ratio_to is not None:
        text += f"   {ratio_label} {ratio_to:.2f}x"
    return text


# --- 1. download ---------------------------------------------------------------------------------

def make_checkpoint(folder: Path, data_gb: float, shards: int = 8) -> None:
    folder.mkdir(parents=True)
    size = int(data_gb * 1e9 / shards)
    for index in range(1, shards + 1):
        with open(folder / f"model-{index:05d}-of-{shards:05d}.safetensors", "wb") as out:
            left = size
            while left:
                block = min(left, 64 << 20)
                out.write(os.urandom(block))
                left -= block
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))


def bench_download(work: Path, data_gb: float, rounds: int, workers: int = 8) -> float:
    src = work / "src"
    make_checkpoint(src, data_gb)
    commit = "b" * 40
    names = sorted(p.name for p in src.iterdir())
    total = sum((src / n).stat().st_size for n in names)
    gb = total / 1e9
    print(f"download: {len(names)} files, {gb:.2f} GB of real random data, static Hub server on loopback, "
          f"{workers} workers, {rounds} rounds")
    figures: dict[str, list[float]] = {"heavylift": [], "heavylift download phase": [], "hf download": [], "curl": []}
    with StaticHub(src, REPO, commit) as mirror:
        files = [{"path": n, "size": size, "sha256": sha} for n, (size, sha) in mirror.files.items()]
        for round_ in range(rounds):
            dest = work / f"dest-{round_}"
            spec = {"repo": REPO, "commit": commit, "local_dir": str(dest / "heavylift"),
                    "manifest": str(dest / "heavylift.manifest.json"), "workers": workers, "endpoint": mirror.url,
                    "verify": "fast", "files": files, "stall_seconds": 300, "tries": 5}
            (dest).mkdir()
            (dest / "request.json").write_text(json.dumps(spec))
            seconds, out = timed([sys.executable, str(REPO_ROOT / "operations/scripts/fetch_weights.py"),
                                  str(dest / "request.json")], env={"HF_HUB_DISABLE_PROGRESS_BARS": "1"})
            figures["heavylift"].append(seconds)
            figures["heavylift download phase"].append(float(re.search(r"GB in ([\d.]+) s", out).group(1)))
            shutil.rmtree(dest / "heavylift")

            seconds, _ = timed([str(BIN / "hf"), "download", REPO, "--revision", commit, "--local-dir",
                                str(dest / "hf"), "--max-workers", str(workers), "--quiet"],
                               env={"HF_ENDPOINT": mirror.url, "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
            figures["hf download"].append(seconds)
            shutil.rmtree(dest / "hf")

            (dest / "curl").mkdir()
            urls = "".join(f"{mirror.url}/{REPO}/resolve/{commit}/{n}\n-o\n{dest / 'curl' / n}\n" for n in names)
            # one curl per file, {workers} at a time: URL, -o, path per three lines of $URLS
            seconds, _ = timed(["sh", "-c", f'printf "%s" "$URLS" | xargs -d "\\n" -P {workers} -n 3 curl -sSf'],
                               env={"URLS": urls})
            figures["curl"].append(seconds)
            for n in names:
                assert (dest / "curl" / n).stat().st_size == (src / n).stat().st_size, n
            shutil.rmtree(dest)
    heavy, heavy_dl, hf, curl = (median(figures[k]) for k in ("heavylift", "heavylift download phase", "hf download", "curl"))
    print(line("heavylift (download + sha256 + manifest)", heavy, gb, hf / heavy, "vs hf download:"))
    print(line("heavylift download phase alone", heavy_dl, gb, hf / heavy_dl, "vs hf download:"))
    print(line("hf download (huggingface_hub CLI)", hf, gb))
    print(line("parallel curl (ceiling)", curl, gb))
    print(f"  heavylift / ceiling: {curl / heavy:.2f} (whole run), {curl / heavy_dl:.2f} (download phase)   "
          f"goals: >= 1.0x hf download, >= 0.8 of curl")
    return gb / heavy_dl


# --- 2. converged re-check ---------------------------------------------------------------------------

NOOP_DEPLOY = '''
from pyinfra.operations import server
'''

WEIGHTS_DEPLOY = '''
import json, sys
sys.path.insert(0, {root!r})
from operations import weights
data = json.load(open({listing!r}))
snapshot = weights.Snapshot(data["repo"], data["commit"], tuple(weights.HubFile(f["path"], f["size"], None) for f in data["files"]))
weights.downloaded(name="weights", snapshot=snapshot, local_dir={folder!r}, manifest={manifest!r},
                   python=sys.executable, script_dir={scripts!r}, disk_margin_gb=0)
'''


def bench_recheck(work: Path, rounds: int, shards: int = 119, total_gb: float = 540.0) -> None:
    folder = work / "recheck" / "content"
    folder.mkdir(parents=True)
    size = int(total_gb * 1e9 / shards)
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    entries = {}
    for name in names:
        path = folder / name
        with open(path, "wb") as out:
            out.truncate(size)  # sparse: apparent size only
        info = path.stat()
        entries[name] = {"size": size, "sha256": "0" * 64, "mtime_ns": info.st_mtime_ns}
    manifest = work / "recheck" / "content.manifest.json"
    manifest.write_text(json.dumps({"repo": REPO, "commit": "0" * 40, "files": entries}))
    listing = work / "recheck" / "listing.json"
    listing.write_text(json.dumps({"repo": REPO, "commit": "0" * 40, "files": [{"path": n, "size": size} for n in names]}))
    weights_deploy, noop_deploy = work / "recheck" / "weights_deploy.py", work / "recheck" / "noop_deploy.py"
    weights_deploy.write_text(WEIGHTS_DEPLOY.format(root=str(REPO_ROOT), listing=str(listing), folder=str(folder),
                                                    manifest=str(manifest), scripts=str(REPO_ROOT / "operations/scripts")))
    noop_deploy.write_text(NOOP_DEPLOY)
    for name in names:  # atime in the past: any read of a shard moves it (relatime)
        os.utime(folder / name, ns=(978307200 * 10**9, entries[name]["mtime_ns"]))
    before = {name: (folder / name).stat().st_atime_ns for name in names}
    pyinfra = str(BIN / "pyinfra")
    runs: dict[str, list[float]] = {"weights": [], "noop": []}
    for _ in range(rounds):
        seconds, out = timed([pyinfra, "-y", "@local", str(weights_deploy)], cwd=work)
        assert "weights" in out and "Success" not in out.split("--> Results:")[-1].split("weights", 1)[1].split("\n")[0], out
        runs["weights"].append(seconds)
        seconds, _ = timed([pyinfra, "-y", "@local", str(noop_deploy)], cwd=work)
        runs["noop"].append(seconds)
    changed = [name for name in names if (folder / name).stat().st_atime_ns != before[name]]
    weights_s, noop_s = median(runs["weights"]), median(runs["noop"])
    print(f"recheck: {shards} shards, {total_gb:.0f} GB apparent (SPARSE files), converged, pyinfra @local, {rounds} rounds")
    print(f"  {'pyinfra run of weights.downloaded (no-op)':<44} {weights_s:8.2f} s")
    print(f"  {'pyinfra run that does nothing':<44} {noop_s:8.2f} s   ratio {weights_s / noop_s:.2f}x (goal <= 1.5x)")
    print(f"  shard bytes read: {'0 (every atime unchanged)' if not changed else f'{len(changed)} shards were read'}")
    shutil.rmtree(work / "recheck")


# --- 3. verify throughput ----------------------------------------------------------------------------

def bench_verify(work: Path, data_gb: float, rounds: int) -> float:
    import verify_weights

    folder = work / "verify"
    make_checkpoint(folder, data_gb, shards=4)
    paths = sorted(str(p) for p in folder.glob("*.safetensors"))
    gb = sum(os.path.getsize(p) for p in paths) / 1e9
    subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True)  # both read from the page cache
    ours, single, theirs = [], [], []
    for _ in range(rounds):
        started = time.monotonic()
        digests = verify_weights.hash_files(paths)
        ours.append(time.monotonic() - started)
        started = time.monotonic()
        verify_weights.hash_files(paths, workers=1)
        single.append(time.monotonic() - started)
        seconds, out = timed(["sha256sum", *paths])
        theirs.append(seconds)
        assert {line.split()[1]: line.split()[0] for line in out.splitlines()} == digests
    mine, one, sha = median(ours), median(single), median(theirs)
    print(f"verify: {len(paths)} files, {gb:.2f} GB of real data from the page cache, {os.cpu_count()} cores, {rounds} rounds")
    print(line("verify_weights.hash_files (all cores)", mine, gb, sha / mine, "vs sha256sum:"))
    print(line("verify_weights.hash_files, one process", one, gb, one / mine, "parallel gain:"))
    print(line("sha256sum, one file after another", sha, gb))
    print(f"  goal >= 1.8x on 2 cores; a full re-hash of 540 GB at this rate: ~{540 / (gb / mine) / 60:.1f} min "
          "(extrapolated, not measured)")
    shutil.rmtree(folder)
    return gb / mine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-gb", type=float, default=2.0, help="real data for the download and verify benchmarks")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="download,recheck,verify")
    args = parser.parse_args()
    chosen = set(args.only.split(","))
    print(f"heavylift weights benchmarks, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="heavylift-bench-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        if "download" in chosen:
            bench_download(work, args.data_gb, args.rounds)
        if "recheck" in chosen:
            bench_recheck(work, args.rounds)
        if "verify" in chosen:
            bench_verify(work, args.data_gb, args.rounds)


if __name__ == "__main__":
    main()
