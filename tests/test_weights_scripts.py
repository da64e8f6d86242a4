"""The host scripts of the weights stage (operations/scripts/), run here: progress lines, byte
counting (with huggingface_hub's own .incomplete paths), parallel verification, and
fetch_weights.py's decisions with huggingface_hub's download replaced by a recorder, the download
watchdog with stand-in children (stall, failure, parent killed); plus the
weights operation's plan line and the new settings.
"""

import glob
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "operations" / "scripts"
sys.path.insert(0, str(SCRIPTS))

import fetch_weights  # noqa: E402
import verify_weights  # noqa: E402

if "pyinfra_fixtures" not in sys.modules:
    pytest.register_assert_rewrite("pyinfra_fixtures")


# --- progress ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("done", "total", "elapsed", "line"), [
    (12_300_000_000, 540_100_000_000, 10.0, "progress: 12.3 GB of 540.1 GB (2.3%), 1.2 GB/s, ETA 7 min 09 s"),
    (0, 540_100_000_000, 10.0, "progress: 0 B of 540.1 GB (0.0%), 0 B/s, ETA unknown"),
    (300_000, 600_000, 2.0, "progress: 300.0 kB of 600.0 kB (50.0%), 150.0 kB/s, ETA 2 s"),
    (540_100_000_000, 540_100_000_000, 300.0, "progress: 540.1 GB of 540.1 GB (100.0%), 1.8 GB/s, ETA 0 s"),
    # more on disk than was asked for (a file re-written in place): capped
    (700, 600, 1.0, "progress: 600 B of 600 B (100.0%), 600 B/s, ETA 0 s"),
    (1_000_000_000, 540_100_000_000, 10.0, "progress: 1.0 GB of 540.1 GB (0.2%), 100.0 MB/s, ETA 1 h 29 min"),
])
def test_progress_line(done, total, elapsed, line):
    assert fetch_weights.progress_line(done, total, elapsed) == line


def test_local_bytes_counts_files_and_hub_incomplete_files(tmp_path):
    from huggingface_hub._local_folder import get_local_download_paths, write_download_metadata

    (tmp_path / "sub").mkdir()
    (tmp_path / "config.json").write_bytes(b"a" * 10)
    (tmp_path / "sub" / "model-00001-of-00002.safetensors").write_bytes(b"b" * 1000)
    # where huggingface_hub 2.4.0 itself puts a partial download and its metadata for local_dir
    paths = get_local_download_paths(tmp_path, "sub/model-00002-of-00002.safetensors")
    incomplete = paths.incomplete_path("0123etag")
    assert incomplete.parent == tmp_path / ".cache" / "huggingface" / "download" / "sub"
    incomplete.write_bytes(b"c" * 333)
    write_download_metadata(tmp_path, "config.json", "0" * 40, "etag")
    (tmp_path / "link").symlink_to(tmp_path / "config.json")
    assert fetch_weights.local_bytes(str(tmp_path)) == 10 + 1000 + 333


# a stand-in for the download child: argv[1] is a folder, argv[2] a behaviour per try (counted in
# a file), writing bytes like huggingface_hub's .incomplete files do
CHILD = r"""
import os, sys, time
folder, plan = sys.argv[1], sys.argv[2].split(",")
os.makedirs(folder, exist_ok=True)
count_file = os.path.join(folder, "tries")
tries = int(open(count_file).read()) + 1 if os.path.exists(count_file) else 1
open(count_file, "w").write(str(tries))
open(os.path.join(folder, "child.pid"), "w").write(str(os.getpid()))
what = plan[min(tries, len(plan)) - 1]
with open(os.path.join(folder, f"part{tries}.bin"), "wb") as out:
    for _ in range(4):
        out.write(b"y" * 500); out.flush(); time.sleep(0.1)
    if what == "stall":
        time.sleep(3600)
    if what.startswith("exit"):
        sys.exit(int(what[4:]))
"""


def watched(tmp_path, plan, stall=0.6, tries=3, total=2000):
    lines = []
    spec = {"repo": "org/m", "commit": "0" * 40, "local_dir": str(tmp_path), "stall_seconds": stall, "tries": tries}
    command = [sys.executable, "-c", CHILD, str(tmp_path), plan]
    started = time.monotonic()
    try:
        used = fetch_weights.download_watched("unused", spec, ["x"], total, out=lines.append, command=command)
    except fetch_weights.DownloadFailed as failure:
        used = failure
    return used, lines, time.monotonic() - started


def test_watchdog_progress_lines_while_bytes_arrive(tmp_path, monkeypatch):
    monkeypatch.setenv("HEAVYLIFT_PROGRESS_SECONDS", "0.1")
    used, lines, _ = watched(tmp_path, "ok")
    assert used == 1
    assert len(lines) >= 2 and all(line.startswith("progress: ") and "\n" not in line for line in lines)
    assert fetch_weights.local_bytes(str(tmp_path)) >= 2000


@pytest.mark.e2e  # real stalls and kills, seconds each: the full suite's
def test_watchdog_restarts_a_stalled_download(tmp_path):
    used, lines, seconds = watched(tmp_path, "stall,ok", stall=0.6)
    assert used == 2, lines
    assert "retrying: no byte arrived for 0.6 s (try 1 of 3); starting again in 1 s, keeping finished files" in lines
    assert seconds < 10


@pytest.mark.e2e  # real stalls and kills, seconds each: the full suite's
def test_watchdog_gives_up_after_the_tries_with_a_clear_message(tmp_path):
    used, lines, seconds = watched(tmp_path, "stall,exit3", stall=0.6, tries=2)
    assert isinstance(used, fetch_weights.DownloadFailed)
    assert str(used).startswith("download of org/m@" + "0" * 40 + " failed after 2 tries: the download exited with code 3.")
    assert "run again to resume" in str(used)
    assert lines[-1].startswith("retrying: no byte arrived for 0.6 s (try 1 of 2)")
    assert seconds < 10  # never hangs


@pytest.mark.e2e  # real stalls and kills, seconds each: the full suite's
def test_download_child_dies_with_a_killed_run(tmp_path):
    """SIGKILL of fetch_weights.py (a killed run, a dropped SSH session) takes its download child with it."""
    import signal
    import subprocess

    parent = subprocess.Popen([sys.executable, "-c", f"""
import sys; sys.path.insert(0, {str(SCRIPTS)!r})
import fetch_weights
spec = {{"repo": "r", "commit": "c", "local_dir": {str(tmp_path)!r}, "stall_seconds": 3600, "tries": 1}}
fetch_weights.download_watched("unused", spec, [], 1, command=[sys.executable, "-c", {CHILD!r}, {str(tmp_path)!r}, "stall"])
"""])
    pid_file = tmp_path / "child.pid"
    deadline = time.monotonic() + 20
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists(), "the download child outlived its killed parent"


def test_one_fetch_per_folder_the_second_waits(tmp_path):
    import subprocess

    manifest = tmp_path / "m.json"
    holder = subprocess.Popen([sys.executable, "-c", f"""
import sys, time; sys.path.insert(0, {str(SCRIPTS)!r})
import fetch_weights
lock = fetch_weights.locked({str(manifest)!r})
print("held", flush=True)
time.sleep(1.0)
"""], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    waiter = subprocess.run([sys.executable, "-c", f"""
import sys; sys.path.insert(0, {str(SCRIPTS)!r})
import fetch_weights
fetch_weights.locked({str(manifest)!r})
"""], capture_output=True, text=True, timeout=30)
    assert waiter.returncode == 0, waiter.stderr
    assert f"waiting for another fetch of this folder to finish (pid {holder.pid} since" in waiter.stdout
    assert time.monotonic() - started >= 0.5
    holder.wait()


def test_progress_interval_from_environment(monkeypatch):
    monkeypatch.delenv("HEAVYLIFT_PROGRESS_SECONDS", raising=False)
    assert fetch_weights.progress_interval() == 10.0
    monkeypatch.setenv("HEAVYLIFT_PROGRESS_SECONDS", "2.5")
    assert fetch_weights.progress_interval() == 2.5
    monkeypatch.setenv("HEAVYLIFT_PROGRESS_SECONDS", "soon")
    assert fetch_weights.progress_interval() == 10.0


# --- verification -----------------------------------------------------------------------------

def make_folder(folder: Path, files: dict[str, bytes]) -> dict:
    entries = {}
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        entries[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "mtime_ns": path.stat().st_mtime_ns}
    return entries


def flip_byte(path: Path, offset: int = 100) -> None:
    """One byte changed in place, size and mtime kept: only a re-hash can tell."""
    info = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def test_check_finds_the_flipped_byte_in_parallel(tmp_path):
    # bigger than one 8 MiB block, so the hash really reads block by block
    entries = make_folder(tmp_path, {
        "a.safetensors": os.urandom(9 * 1024 * 1024), "b.safetensors": os.urandom(1000), "c.json": b"{}",
        "d.safetensors": b"short",
    })
    flip_byte(tmp_path / "a.safetensors", 8 * 1024 * 1024 + 5)
    (tmp_path / "c.json").unlink()
    (tmp_path / "d.safetensors").write_bytes(b"longer!")
    good, bad = verify_weights.check(entries, str(tmp_path), workers=3)
    assert set(good) == {"b.safetensors"}
    assert set(bad) == {"a.safetensors", "c.json", "d.safetensors"}
    assert bad["c.json"] == "missing"
    assert bad["d.safetensors"] == "7 bytes, the manifest says 5"
    assert bad["a.safetensors"].startswith("sha256 ")


def test_hash_files_matches_hashlib(tmp_path):
    entries = make_folder(tmp_path, {f"f{i}": os.urandom(1000 * i) for i in range(6)})
    digests = verify_weights.hash_files([str(tmp_path / n) for n in entries], workers=4)
    assert digests == {str(tmp_path / n): e["sha256"] for n, e in entries.items()}
    assert verify_weights.hash_files([]) == {}


def test_verify_cli_reports_and_deletes_bad_files(tmp_path, capsys):
    folder = tmp_path / "content"
    entries = make_folder(folder, {"a.safetensors": os.urandom(5000), "b.safetensors": os.urandom(5000)})
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"files": entries}))
    assert verify_weights.main([str(manifest), str(folder)]) == 0
    flip_byte(folder / "b.safetensors")
    assert verify_weights.main([str(manifest), str(folder), "--delete-bad"]) == 1
    out = capsys.readouterr().out
    assert "FAILED b.safetensors: sha256" in out and "verified 1 of 2 files" in out
    assert not (folder / "b.safetensors").exists() and (folder / "a.safetensors").exists()


# --- fetch_weights.main with the Hub download replaced -------------------------------------------

class FakeHub:
    """Stands in for huggingface_hub.snapshot_download: writes the published bytes of the files asked for."""

    def __init__(self, published: dict[str, bytes]):
        self.published = published
        self.calls: list[list[str]] = []

    def __call__(self, repo_id, revision, local_dir, allow_patterns, max_workers, endpoint):
        import fnmatch

        names = [n for n in self.published if any(fnmatch.fnmatch(n, p) for p in allow_patterns)]
        self.calls.append(sorted(names))
        for name in names:
            path = Path(local_dir) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self.published[name])


def in_process(hub):
    """fetch_weights.main's download step, calling the stand-in in this process instead of a watched child."""
    def download(spec_path, spec, need, total):
        hub(spec["repo"], spec["commit"], spec["local_dir"], [glob.escape(n) for n in need], spec["workers"], spec["endpoint"])
    return download


@pytest.fixture
def fetch_setup(tmp_path):
    published = {"config.json": b'{"a": 1}', "model-00001-of-00002.safetensors": os.urandom(20000),
                 "model-00002-of-00002.safetensors": os.urandom(30000), "we[ir]d name.json": b"[]"}
    hub = FakeHub(published)
    folder = tmp_path / "content"
    manifest = tmp_path / "content.manifest.json"

    def run(verify="fast", hub_sha=True):
        spec = {
            "repo": "org/m", "commit": "0" * 40, "local_dir": str(folder), "manifest": str(manifest), "workers": 2,
            "endpoint": None, "verify": verify,
            "files": [{"path": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest() if hub_sha and n.endswith(".safetensors") else None}
                      for n, d in published.items()],
        }
        spec_path = tmp_path / "request.json"
        spec_path.write_text(json.dumps(spec))
        fetch_weights.main(str(spec_path), download=in_process(hub))

    return hub, folder, manifest, run


def test_fetch_clean_then_rerun_fetches_nothing(fetch_setup, capsys):
    hub, folder, manifest, run = fetch_setup
    run()
    assert hub.calls == [sorted(hub.published)]
    written = json.loads(manifest.read_text())["files"]
    assert {n: e["sha256"] for n, e in written.items()} == {n: hashlib.sha256(d).hexdigest() for n, d in hub.published.items()}
    stamp = manifest.stat().st_mtime_ns
    run()
    assert len(hub.calls) == 1 and manifest.stat().st_mtime_ns == stamp
    assert "nothing changed" in capsys.readouterr().out


def test_fetch_verify_full_refetches_only_the_flipped_shard(fetch_setup, capsys):
    hub, folder, manifest, run = fetch_setup
    run(hub_sha=False)  # a mirror without LFS hashes: only the manifest knows the sha256
    other = (folder / "model-00001-of-00002.safetensors").stat()
    flip_byte(folder / "model-00002-of-00002.safetensors")
    run(verify="fast", hub_sha=False)  # fast trusts size + mtime: not seen
    assert len(hub.calls) == 1
    run(verify="full", hub_sha=False)
    assert hub.calls[1:] == [["model-00002-of-00002.safetensors"]]
    assert (folder / "model-00002-of-00002.safetensors").read_bytes() == hub.published["model-00002-of-00002.safetensors"]
    after = (folder / "model-00001-of-00002.safetensors").stat()
    assert (after.st_ino, after.st_mtime_ns) == (other.st_ino, other.st_mtime_ns)
    out = capsys.readouterr().out
    assert "FAILED model-00002-of-00002.safetensors: sha256" in out
    entry = json.loads(manifest.read_text())["files"]["model-00002-of-00002.safetensors"]
    assert entry["mtime_ns"] == (folder / "model-00002-of-00002.safetensors").stat().st_mtime_ns


def test_fetch_partial_folder_fetches_missing_and_wrong_size(fetch_setup):
    hub, folder, manifest, run = fetch_setup
    folder.mkdir()
    (folder / "config.json").write_bytes(hub.published["config.json"])  # a killed run left it, no manifest
    (folder / "model-00002-of-00002.safetensors").write_bytes(b"short")
    run()
    assert hub.calls == [["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "we[ir]d name.json"]]
    assert manifest.exists()


def test_fetch_refuses_a_download_that_does_not_match_the_hub(fetch_setup):
    hub, folder, manifest, run = fetch_setup
    good = hub.published["model-00001-of-00002.safetensors"]
    run()
    manifest.unlink()
    (folder / "model-00001-of-00002.safetensors").unlink()
    hub.published["model-00001-of-00002.safetensors"] = b"z" * len(good)  # the mirror serves other bytes
    spec = json.loads((folder.parent / "request.json").read_text())
    (folder.parent / "request.json").write_text(json.dumps(spec))
    with pytest.raises(SystemExit, match="does not match the Hub's"):
        fetch_weights.main(str(folder.parent / "request.json"), download=in_process(hub))
    assert not manifest.exists()


# --- the settings (the operation's plan line: test_operations_weights.py) ---------------------


def test_settings_verify_and_disk_margin():
    from pydantic import ValidationError

    from models.schema import SiteSettings
    from models.validate import schema_hints

    base = {"model": "tiny-llama", "vllm": {"version": "0.34.0"}}
    settings = SiteSettings.model_validate(base)
    assert (settings.verify, settings.disk_margin_gb) == ("fast", 20)
    assert SiteSettings.model_validate({**base, "verify": "full", "disk_margin_gb": 0.5}).disk_margin_gb == 0.5
    for bad in ({"verify": "sometimes"}, {"disk_margin_gb": -1}, {"disk_margin_gb": True}):
        with pytest.raises(ValidationError):
            SiteSettings.model_validate({**base, **bad})
    assert schema_hints()["verify"].startswith('set verify to "fast" or "full" (fast: trust')
    assert schema_hints()["disk_margin_gb"].startswith("set disk_margin_gb to GB to keep free")
    assert SiteSettings.model_fields["verify"].description and SiteSettings.model_fields["disk_margin_gb"].description


def test_download_child_reads_the_hub_token_from_its_file(tmp_path, monkeypatch):
    """Gated repos: the token comes from a 0600 file named in the request, never from argv or the request."""
    import io

    calls = []
    monkeypatch.setattr(fetch_weights, "fetch_file", lambda spec, name, token: calls.append((name, token)))
    token_file = tmp_path / "hub.token"
    token_file.write_text("hf_fake_token_for_tests\n")
    spec = {"repo": "org/m", "commit": "0" * 40, "local_dir": str(tmp_path / "c"), "workers": 2, "endpoint": None}
    for with_token in (True, False):
        request = tmp_path / "request.json"
        request.write_text(json.dumps({**spec, **({"token_file": str(token_file)} if with_token else {})}))
        monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(["a b.safetensors"])))
        fetch_weights.download_child(str(request))
        assert "hf_fake_token_for_tests" not in request.read_text()
    assert calls == [("a b.safetensors", "hf_fake_token_for_tests"), ("a b.safetensors", None)]


# --- resuming a killed run's partial files, against a real Range-capable Hub stand-in ------------

@pytest.fixture
def static_hub(tmp_path):
    """benchmarks/static_hub.py serving three 3 MB shards and a config at a fixed commit, counting bytes."""
    from benchmarks.static_hub import StaticHub

    published = tmp_path / "published"
    (published / "sub").mkdir(parents=True)
    for name in ("sub/s1.safetensors", "s2.safetensors", "s3.safetensors"):
        (published / name).write_bytes(os.urandom(3_000_000))
    (published / "config.json").write_bytes(b'{"a": 1}')
    with StaticHub(published, "org/m", "c" * 40) as hub:
        yield hub


def hub_spec(hub, tmp_path, workers=3):
    folder = tmp_path / "content"
    spec = {"repo": hub.repo, "commit": hub.commit, "local_dir": str(folder), "manifest": str(tmp_path / "m.json"),
            "workers": workers, "endpoint": hub.url, "verify": "fast", "tries": 2, "stall_seconds": 30,
            "files": [{"path": name, "size": size, "sha256": sha if name.endswith(".safetensors") else None}
                      for name, (size, sha) in hub.files.items()]}
    path = tmp_path / "request.json"
    path.write_text(json.dumps(spec))
    return str(path), folder


def partial_path(folder, name, etag):
    """Where fetch_file keeps a file's bytes while it downloads: huggingface_hub's incomplete_path(etag)."""
    from huggingface_hub._local_folder import get_local_download_paths

    return get_local_download_paths(Path(folder), name).incomplete_path(etag)


def test_fetch_resumes_partial_files_with_range_requests_and_removes_stale_ones(static_hub, tmp_path, capsys):
    hub = static_hub
    spec_path, folder = hub_spec(hub, tmp_path)
    files = {name: (hub.folder / name).read_bytes() for name in hub.files}
    sha = {name: digest for name, (_, digest) in hub.files.items()}
    # what a SIGKILLed run leaves: two shards half written under the resumable name; one under
    # huggingface_hub 2.4.0's own process-unique name (from before heavylift resumed); a partial
    # file of a config (no sha256: never resumed)
    partial_path(folder, "sub/s1.safetensors", sha["sub/s1.safetensors"]).write_bytes(files["sub/s1.safetensors"][:1_000_000])
    partial_path(folder, "s2.safetensors", sha["s2.safetensors"]).write_bytes(files["s2.safetensors"][:2_500_000])
    unique = partial_path(folder, "s3.safetensors", sha["s3.safetensors"])
    unique = unique.with_name(f"{unique.stem}.0a1b2c3d.incomplete")
    unique.write_bytes(files["s3.safetensors"][:1_500_000])
    config_partial = partial_path(folder, "config.json", "e" * 40)
    config_partial.write_bytes(b'{"a"')

    fetch_weights.main(spec_path)

    out = capsys.readouterr().out
    assert "removed 2 partial files no run can resume, 1.5 MB" in out
    assert "resuming 2 partial files (3.5 MB kept)" in out
    assert hub.served == {"sub/s1.safetensors": 2_000_000, "s2.safetensors": 500_000, "s3.safetensors": 3_000_000,
                          "config.json": 8}
    assert sorted(hub.ranges) == [("s2.safetensors", "bytes=2500000-"), ("sub/s1.safetensors", "bytes=1000000-")]
    for name, data in files.items():
        assert (folder / name).read_bytes() == data, name
    assert list(folder.rglob("*.incomplete")) == []
    manifest = json.loads((tmp_path / "m.json").read_text())["files"]
    assert {name: entry["sha256"] for name, entry in manifest.items()} == {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}
    # the folder ends as snapshot_download leaves it: its metadata names the commit
    from huggingface_hub._local_folder import read_download_metadata

    assert read_download_metadata(folder, "sub/s1.safetensors").commit_hash == hub.commit


def test_fetch_torn_partial_fails_its_hash_and_is_fetched_again(static_hub, tmp_path, capsys):
    """A power cut can leave a partial file whose bytes are not the file's: resumed, it fails the Hub's
    sha256, is deleted and fetched whole."""
    hub = static_hub
    spec_path, folder = hub_spec(hub, tmp_path, workers=1)
    sha = hub.files["s2.safetensors"][1]
    partial_path(folder, "s2.safetensors", sha).write_bytes(os.urandom(1_000_000))
    fetch_weights.main(spec_path)
    assert "FAILED s2.safetensors: sha256" in capsys.readouterr().out
    assert hub.served["s2.safetensors"] == 2_000_000 + 3_000_000
    assert (folder / "s2.safetensors").read_bytes() == (hub.folder / "s2.safetensors").read_bytes()
    assert list(folder.rglob("*.incomplete")) == []
