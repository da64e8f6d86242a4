"""Site source transfer benchmark: heavylift's host-to-host copy against plain parallel curl, same files,
same server, same link, side by side in one run.

    .venv/bin/python benchmarks/bench_site_source.py [--data-gb 1] [--rounds 3] [--workers 8]

A site source (operations/scripts/site_source_server.py, started as on a source host, in its own
process) serves a verified snapshot of real random data (--data-gb, in 8 shards) on loopback. Each
round, in turns:

1. plain parallel curl: one ``curl -sSf URL -o FILE`` per file, --workers at a time (xargs -P): the
   ceiling, no resume, no verification;
2. heavylift's copy (site_fetch.py, what a copying host runs): the source's listing, then parallel
   ``curl --continue-at -`` into partial files hashed while they are written, renamed after the
   sha256 matched, the manifest. Timed whole (listing to manifest) and its transfer phase alone;
3. heavylift's Hub path on the same files (fetch_weights.py: huggingface_hub's http_get, then sha256
   of every file), pointed at the same server, which is Hub-compatible: for reference.

Printed: seconds, MB/s, the ratio to curl (goal >= 0.8 for the whole copy), the CPU seconds the
client and the server used (user + system, from getrusage and /proc/<pid>/stat) and the load average.
Figures are medians of --rounds. The data lives under /var/tmp and is removed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = REPO_ROOT / "operations" / "scripts"
REPO = "heavylift/bench-site-source"
COMMIT = "c" * 40
TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_snapshot(models: Path, data_gb: float, shards: int = 8) -> tuple[Path, dict]:
    """A verified snapshot as fetch_weights.py leaves one: the content folder and its manifest."""
    content = models / REPO.replace("/", "--") / COMMIT
    content.mkdir(parents=True)
    size = int(data_gb * 1e9 / shards)
    entries = {}
    for index in range(1, shards + 1):
        name = f"model-{index:05d}-of-{shards:05d}.safetensors"
        digest = hashlib.sha256()
        with open(content / name, "wb") as out:
            left = size
            while left:
                block = os.urandom(min(left, 64 << 20))
                digest.update(block)
                out.write(block)
                left -= len(block)
        entries[name] = {"size": size, "sha256": digest.hexdigest(), "mtime_ns": (content / name).stat().st_mtime_ns}
    config = b'{"model_type": "llama"}'
    (content / "config.json").write_bytes(config)
    entries["config.json"] = {"size": len(config), "sha256": hashlib.sha256(config).hexdigest(),
                              "mtime_ns": (content / "config.json").stat().st_mtime_ns}
    Path(f"{content}.manifest.json").write_text(json.dumps({"repo": REPO, "commit": COMMIT, "files": entries}))
    return content, entries


def cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def timed(command: list[str], server_pid: int, env: dict | None = None) -> dict:
    before, server_before = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_of(server_pid)
    started = time.monotonic()
    done = subprocess.run(command, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    seconds = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{command[:3]} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return {"seconds": seconds, "output": done.stdout + done.stderr,
            "client_cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "server_cpu": cpu_of(server_pid) - server_before, "load": os.getloadavg()[0]}


def check_copy(folder: Path, entries: dict, hashes: bool) -> None:
    for name, entry in entries.items():
        path = folder / name
        assert path.stat().st_size == entry["size"], name
        if hashes:
            assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"], name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-gb", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--skip-hub-path", action="store_true", help="leave out heavylift's Hub path (slow)")
    args = parser.parse_args()
    base = Path("/var/tmp")
    free = shutil.disk_usage(base).free
    need = args.data_gb * 1e9 * 2.2  # the source, one copy at a time, room to spare
    if free < need:
        raise SystemExit(f"{base} has {free / 1e9:.1f} GB free; this run needs {need / 1e9:.1f} GB (lower --data-gb)")
    print(f"heavylift site source benchmark, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}, {free / 1e9:.0f} GB free on {base}")
    with tempfile.TemporaryDirectory(prefix="heavylift-bench-site-", dir=base) as tmp:
        work = Path(tmp)
        content, entries = make_snapshot(work / "source" / "models", args.data_gb)
        total = sum(entry["size"] for entry in entries.values())
        port = free_port()
        server = subprocess.Popen([sys.executable, str(SCRIPTS / "site_source_server.py"), "--models",
                                   str(work / "source" / "models"), "--bind", "127.0.0.1", "--port", str(port)],
                                  stdout=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 10
            while subprocess.run(["curl", "-sf", "-o", "/dev/null", f"{url}/heavylift/health"]).returncode != 0:
                if time.monotonic() > deadline:
                    raise SystemExit("the site source did not start")
                time.sleep(0.1)
            subprocess.run(["cat", *[str(content / n) for n in entries]], stdout=subprocess.DEVNULL, check=True)
            print(f"{len(entries)} files, {total / 1e9:.2f} GB of real random data, served by site_source_server.py "
                  f"(pid {server.pid}) on loopback, {args.workers} at a time, {args.rounds} rounds, the source in the page cache")
            figures: dict[str, list[dict]] = {"curl": [], "copy": [], "hub": []}
            files = [{"path": name, "size": entry["size"], "sha256": None} for name, entry in entries.items()]
            for round_ in range(args.rounds):
                order = ["curl", "copy", "hub"] if round_ % 2 == 0 else ["hub", "copy", "curl"]
                for method in order:
                    if method == "hub" and args.skip_hub_path:
                        continue
                    dest = work / f"dest-{round_}-{method}"
                    dest.mkdir()
                    if method == "curl":
                        (dest / "c").mkdir()
                        urls = "".join(f"{url}/{REPO}/resolve/{COMMIT}/{n}\n-o\n{dest / 'c' / n}\n" for n in entries)
                        result = timed(["sh", "-c", f'printf "%s" "$URLS" | xargs -d "\\n" -P {args.workers} -n 3 curl -sSf'],
                                       server.pid, env={"URLS": urls})
                        check_copy(dest / "c", entries, hashes=False)
                    else:
                        spec = {"repo": REPO, "commit": COMMIT, "local_dir": str(dest / "c"),
                                "manifest": str(dest / "c.manifest.json"), "workers": args.workers,
                                "endpoint": url, "verify": "fast", "stall_seconds": 60, "tries": 3, "files": files}
                        script = "fetch_weights.py"
                        if method == "copy":
                            spec["source"] = {"url": url, "name": "bench-source", "wait_seconds": 5}
                            script = "site_fetch.py"
                        (dest / "request.json").write_text(json.dumps(spec))
                        result = timed([sys.executable, str(SCRIPTS / script), str(dest / "request.json")], server.pid,
                                       env={"HF_HUB_DISABLE_PROGRESS_BARS": "1"})
                        result["transfer"] = float(re.search(r"downloaded \d+ files, [\d.]+ GB in ([\d.]+) s",
                                                             result["output"]).group(1))
                        manifest = json.loads((dest / "c.manifest.json").read_text())["files"]
                        assert {n: e["sha256"] for n, e in manifest.items()} == {n: e["sha256"] for n, e in entries.items()}
                        check_copy(dest / "c", entries, hashes=False)
                    figures[method].append(result)
                    shutil.rmtree(dest)
        finally:
            server.terminate()
            server.wait(timeout=10)

    def med(method, key):
        return statistics.median(r[key] for r in figures[method])

    curl_s = med("curl", "seconds")
    mb = total / 1e6
    rows = [("plain parallel curl (the ceiling)", "curl", "seconds")]
    rows += [("heavylift site copy, whole (listing..manifest)", "copy", "seconds"),
             ("heavylift site copy, transfer phase", "copy", "transfer")]
    if figures["hub"]:
        rows += [("heavylift Hub path, whole (reference)", "hub", "seconds"),
                 ("heavylift Hub path, download phase", "hub", "transfer")]
    print(f"\n  {'method':<48} {'s':>7} {'MB/s':>8} {'vs curl':>8} {'client CPU s':>13} {'server CPU s':>13} {'load':>5}")
    for label, method, key in rows:
        seconds = med(method, key)
        rate = mb / seconds
        # a loopback copy cannot beat memory bandwidth: a figure above ~50 GB/s is a measuring error
        assert rate < 50_000, f"{label}: {rate:.0f} MB/s is not physically possible here"
        print(f"  {label:<48} {seconds:7.2f} {rate:8.0f} {curl_s / seconds:8.2f} {med(method, 'client_cpu'):13.2f} "
              f"{med(method, 'server_cpu'):13.2f} {med(method, 'load'):5.2f}")
    ratio = curl_s / med("copy", "seconds")
    print(f"\n  heavylift site copy / parallel curl: {ratio:.2f} (goal >= 0.8; the copy also hashes every byte, "
          f"resumes and writes the manifest)")
    if figures["hub"]:
        print(f"  heavylift Hub path / parallel curl: {curl_s / med('hub', 'seconds'):.2f}; site copy / Hub path: "
              f"{med('hub', 'seconds') / med('copy', 'seconds'):.1f}x faster")


if __name__ == "__main__":
    main()
