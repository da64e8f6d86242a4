"""The site source's host scripts on loopback, in process (no SSH, no pyinfra): site_source_server.py
serves only what a manifest vouches for and is Hub-compatible (huggingface_hub's own snapshot_download
reads it); site_fetch.py copies, verifies, resumes a killed copy with only the missing bytes, catches a
torn partial file, and refuses a source that does not hold the Hub's bytes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = REPO_ROOT / "operations" / "scripts"
sys.path.insert(0, str(SCRIPTS))

from site_source_server import SiteSourceServer  # noqa: E402

REPO, COMMIT = "heavylift/tiny", "7" * 40


def publish(models: Path, sizes: dict[str, int], manifest: bool = True) -> dict:
    content = models / "heavylift--tiny" / COMMIT
    content.mkdir(parents=True, exist_ok=True)
    entries = {}
    for name, size in sizes.items():
        data = os.urandom(size)
        (content / name).write_bytes(data)
        entries[name] = {"size": size, "sha256": hashlib.sha256(data).hexdigest(),
                         "mtime_ns": (content / name).stat().st_mtime_ns}
    if manifest:
        Path(f"{content}.manifest.json").write_text(json.dumps({"repo": REPO, "commit": COMMIT, "files": entries}))
    return entries


@pytest.fixture
def source(tmp_path):
    def start(sizes, token=None, manifest=True):
        entries = publish(tmp_path / "models", sizes, manifest)
        server = SiteSourceServer(str(tmp_path / "models"), "127.0.0.1", 0, token)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        server.url = f"http://127.0.0.1:{server.server_address[1]}"
        server.entries = entries
        server.content = tmp_path / "models" / "heavylift--tiny" / COMMIT
        return server

    started: list[SiteSourceServer] = []
    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def get(url, headers=None):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as answer:
            return answer.status, answer.read(), dict(answer.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def test_only_files_a_manifest_vouches_for_are_served(source, tmp_path):
    server = source({"a.safetensors": 100_000, "config.json": 50}, manifest=False)
    resolve = f"{server.url}/{REPO}/resolve/{COMMIT}"
    assert get(f"{resolve}/a.safetensors")[0] == 404  # no manifest yet: a fetch in progress
    assert get(f"{server.url}/api/models/{REPO}/tree/{COMMIT}")[0] == 404
    publish(tmp_path / "models", {}, manifest=False)
    Path(f"{server.content}.manifest.json").write_text(json.dumps({"repo": REPO, "commit": COMMIT, "files": server.entries}))
    code, body, _ = get(f"{server.url}/api/models/{REPO}/tree/{COMMIT}?recursive=true")
    assert code == 200
    assert {e["path"]: e["lfs"]["oid"] for e in json.loads(body)} == {n: e["sha256"] for n, e in server.entries.items()}
    code, body, headers = get(f"{resolve}/a.safetensors")
    assert code == 200 and hashlib.sha256(body).hexdigest() == server.entries["a.safetensors"]["sha256"]
    assert headers["ETag"] == f'"{server.entries["a.safetensors"]["sha256"]}"' and headers["X-Repo-Commit"] == COMMIT
    code, body, headers = get(f"{resolve}/a.safetensors", {"Range": "bytes=99000-"})
    assert code == 206 and len(body) == 1000 and headers["Content-Range"] == "bytes 99000-99999/100000"
    # what is not listed, or no longer what was verified, is not served
    (server.content / ".cache").mkdir()
    (server.content / ".cache" / "x.incomplete").write_bytes(b"half")
    (server.content / "extra.bin").write_bytes(b"not verified")
    for path in (".cache/x.incomplete", "extra.bin", "../heavylift--tiny/" + COMMIT + "/config.json"):
        assert get(f"{resolve}/{path}")[0] == 404, path
    os.utime(server.content / "config.json", ns=(0, 0))  # changed after the manifest was written
    assert get(f"{resolve}/config.json")[0] == 404
    assert get(f"{server.url}/api/models/{REPO}/revision/{'8' * 40}")[0] == 404


def test_a_token_is_required_when_the_site_has_one(source):
    server = source({"a.safetensors": 10}, token="s3cret")
    tree = f"{server.url}/api/models/{REPO}/tree/{COMMIT}"
    assert get(tree)[0] == 401
    assert get(tree, {"Authorization": "Bearer wrong"})[0] == 401
    assert get(tree, {"Authorization": "Bearer s3cret"})[0] == 200
    assert get(f"{server.url}/heavylift/health")[0] == 200


def test_huggingface_hubs_own_download_reads_it(source, tmp_path):
    from huggingface_hub import snapshot_download

    server = source({"model.safetensors": 300_000, "config.json": 40})
    folder = snapshot_download(REPO, revision=COMMIT, endpoint=server.url, local_dir=tmp_path / "hf")
    for name, entry in server.entries.items():
        assert hashlib.sha256((Path(folder) / name).read_bytes()).hexdigest() == entry["sha256"]


def request(tmp_path, server, sha256=True, wait_seconds=5, workers=4, **extra) -> Path:
    dest = tmp_path / "dest"
    dest.mkdir(exist_ok=True)
    spec = {"repo": REPO, "commit": COMMIT, "local_dir": str(dest / "content"), "manifest": str(dest / "content.manifest.json"),
            "workers": workers, "endpoint": None, "verify": "fast", "stall_seconds": 10, "tries": 3,
            "files": [{"path": n, "size": e["size"], "sha256": e["sha256"] if sha256 else None} for n, e in server.entries.items()],
            "source": {"url": server.url, "name": "src1", "wait_seconds": wait_seconds}, **extra}
    path = dest / "request.json"
    path.write_text(json.dumps(spec))
    return path


def copy(path: Path, **kwargs):
    return subprocess.run([sys.executable, str(SCRIPTS / "site_fetch.py"), str(path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "HEAVYLIFT_PROGRESS_SECONDS": "0.2"}, **kwargs)


def manifest_of(path: Path) -> dict:
    spec = json.loads(path.read_text())
    return {n: e["sha256"] for n, e in json.loads(Path(spec["manifest"]).read_text())["files"].items()}


def test_a_copy_verifies_every_file_and_writes_the_manifest(source, tmp_path):
    server = source({f"m{i}.safetensors": 2_000_000 + i for i in range(5)} | {"config.json": 30})
    path = request(tmp_path, server, sha256=False)  # a mirror without LFS sha256: the source's are taken
    done = copy(path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert manifest_of(path) == {n: e["sha256"] for n, e in server.entries.items()}
    assert sum(server.served.values()) == sum(e["size"] for e in server.entries.values())  # each byte once
    content = tmp_path / "dest" / "content"
    assert not list(content.rglob("*.incomplete"))
    metadata = (content / ".cache" / "huggingface" / "download" / "m0.safetensors.metadata").read_text().split("\n")
    assert metadata[:2] == [COMMIT, server.entries["m0.safetensors"]["sha256"]]  # as huggingface_hub leaves it
    again = copy(path)  # nothing to fetch: the manifest vouches for every file
    assert again.returncode == 0 and "nothing changed" in again.stdout, again.stdout


def curls_for(folder: Path) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"curl") and any(str(folder).encode() in arg for arg in argv):
            found.append(int(pid))
    return found


@pytest.mark.e2e  # a copy killed mid-way and run again (~7 s): the full suite's
def test_a_killed_copy_resumes_with_only_the_missing_bytes(source, tmp_path):
    from testbed.fault_proxy import FaultProxy

    server = source({f"m{i}.safetensors": 6 << 20 for i in range(3)})
    total = sum(e["size"] for e in server.entries.values())
    with FaultProxy(server.server_address[1]) as proxy:
        proxy.set("slow", rate=3_000_000)
        slow = type("S", (), {"url": proxy.url, "entries": server.entries})
        path = request(tmp_path, slow, workers=3)
        process = subprocess.Popen([sys.executable, str(SCRIPTS / "site_fetch.py"), str(path)], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT)
        partials = tmp_path / "dest" / "content" / ".cache"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if sum(p.stat().st_size for p in partials.rglob("*.incomplete")) > 4 << 20:
                break
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)  # the run dies: its child and curls with it
        process.wait()
        deadline = time.monotonic() + 10
        while curls_for(tmp_path / "dest") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert curls_for(tmp_path / "dest") == [], "a curl outlived the killed copy"
        proxy.heal()
        kept = sum(p.stat().st_size for p in partials.rglob("*.incomplete"))
        assert kept > 0
        time.sleep(0.5)  # the killed transfers' last bytes leave the server
        server.served.clear()
        done = copy(path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resuming 3 partial files" in done.stdout, done.stdout
    assert sum(server.served.values()) == total - kept
    assert manifest_of(path) == {n: e["sha256"] for n, e in server.entries.items()}


def test_a_torn_partial_file_is_caught_by_its_hash_and_fetched_again(source, tmp_path):
    sys.path.insert(0, str(SCRIPTS))
    from site_fetch import partial_path

    server = source({"m0.safetensors": 3 << 20})
    path = request(tmp_path, server)
    entry = server.entries["m0.safetensors"]
    torn = Path(partial_path(str(tmp_path / "dest" / "content"), "m0.safetensors", entry["sha256"]))
    torn.parent.mkdir(parents=True)
    torn.write_bytes(os.urandom(1 << 20))  # a power cut: bytes that are not the file's
    done = copy(path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAILED m0.safetensors: sha256" in done.stdout
    assert "retrying" in done.stdout
    assert manifest_of(path) == {"m0.safetensors": entry["sha256"]}


def test_a_source_without_the_snapshot_fails_naming_it(source, tmp_path):
    server = source({"m0.safetensors": 1000}, manifest=False)
    started = time.monotonic()
    done = copy(request(tmp_path, server, wait_seconds=1))
    assert done.returncode != 0
    assert (f"the site source src1 ({server.url}) holds no verified {REPO}@{COMMIT} (HTTP 404): its own download has "
            "not finished, failed, or ran for another commit. Fix: run the deploy with src1 in it") in done.stderr
    assert time.monotonic() - started < 10
    assert not (tmp_path / "dest" / "content.manifest.json").exists()


def test_a_source_holding_other_bytes_is_refused(source, tmp_path):
    server = source({"m0.safetensors": 1000})
    path = request(tmp_path, server)
    spec = json.loads(path.read_text())
    spec["files"][0]["sha256"] = "0" * 64  # what the Hub lists
    path.write_text(json.dumps(spec))
    done = copy(path)
    assert done.returncode != 0
    assert f"does not hold the Hub's {REPO}@{COMMIT}: m0.safetensors has sha256" in done.stderr
    assert sum(server.served.values()) == 0
