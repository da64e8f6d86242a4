"""An uploaded wheelhouse (vllm.wheelhouse_upload): a converged run hashes nothing, and any changed wheel is
noticed and uploaded again (resolve/wheelhouse.py, operations/runtime.py ``wheelhouse_uploaded``)."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest
from pyinfra.connectors.local import LocalConnector
from pyinfra.connectors.ssh import SSHConnector

from operations import runtime
from resolve import wheelhouse
from pyinfra_fixtures import FakeHost, run_operation

WHEEL = "vllm-0.26.0-cp38-abi3-manylinux_2_31_x86_64.whl"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEAVYLIFT_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def hashed(monkeypatch):
    """The files whose bytes were hashed, in order; files written by the test count as old enough to keep
    (the racy window is tested on its own)."""
    seen = []
    real = wheelhouse._hash_file

    def counting(path):
        seen.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(wheelhouse, "_hash_file", counting)
    monkeypatch.setattr(wheelhouse, "RACY_SECONDS", 0.0)
    return seen


def write(path, data: bytes, mtime_ns: int | None = None):
    path.write_bytes(data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def test_a_wheel_is_hashed_once_and_its_digest_is_its_content(tmp_path, hashed):
    wheel = write(tmp_path / WHEEL, b"a" * 1000)
    assert wheelhouse.file_sha256(wheel) == hashlib.sha256(b"a" * 1000).hexdigest()
    assert wheelhouse.file_sha256(wheel) == hashlib.sha256(b"a" * 1000).hexdigest()
    assert hashed == [WHEEL]


def test_a_wheel_written_a_moment_ago_is_hashed_every_time(tmp_path, monkeypatch):
    # within the clock tick of its last write a second write can leave mtime and ctime as they were
    seen = []
    monkeypatch.setattr(wheelhouse, "_hash_file", lambda path: seen.append(path) or "digest")
    wheel = write(tmp_path / WHEEL, b"a")
    wheelhouse.file_sha256(wheel)
    wheelhouse.file_sha256(wheel)
    assert len(seen) == 2


@pytest.mark.parametrize("change", ["size", "mtime", "same size and mtime", "replaced by a copy"])
def test_a_changed_wheel_is_hashed_again(tmp_path, hashed, change):
    wheel = write(tmp_path / WHEEL, b"a" * 1000, mtime_ns=1_700_000_000_000_000_000)
    before = wheelhouse.file_sha256(wheel)
    time.sleep(0.05)  # past the clock tick of the first write (a kept digest is older than RACY_SECONDS)
    if change == "size":
        write(wheel, b"a" * 1001, mtime_ns=1_700_000_000_000_000_000)
    elif change == "mtime":
        os.utime(wheel, ns=(1_700_000_001_000_000_000, 1_700_000_001_000_000_000))
    elif change == "same size and mtime":
        # rewritten in place and its mtime put back (touch -d): the ctime moved, and nobody can set it back
        write(wheel, b"b" * 1000, mtime_ns=1_700_000_000_000_000_000)
    else:
        other = write(tmp_path / "other", b"c" * 1000, mtime_ns=1_700_000_000_000_000_000)
        os.replace(other, wheel)  # a new inode under the old name (cp -p, a fresh download with its mtime)
    after = wheelhouse.file_sha256(wheel)
    assert len(hashed) == 2
    assert (after == before) == (change == "mtime")  # only the mtime moved: same bytes, same digest
    assert after == hashlib.sha256(wheel.read_bytes()).hexdigest()


def local_folder(tmp_path, *names):
    folder = tmp_path / "wheelhouse"
    folder.mkdir(exist_ok=True)
    for index, name in enumerate(names):
        write(folder / name, bytes([65 + index]) * (100 + index), mtime_ns=1_700_000_000_000_000_000 + index * 10**9)
    return folder


def uploaded_state(folder):
    """The host's copy after a full upload: the record and the stat of each wheel."""
    wheels = wheelhouse.local_wheels(folder)
    return {"record": wheelhouse.record_of(wheels, {}), "wheels": {w.name: (w.size, w.mtime) for w in wheels}}


def run(src, dest, copy, connector=SSHConnector, monkeypatch=None):
    monkeypatch.setattr(FakeHost, "connector_cls", connector, raising=False)
    return run_operation(runtime.wheelhouse_uploaded, {"src": str(src), "dest": dest},
                         {"runtime.WheelhouseCopy": {f"folder={dest}": copy}})


def test_converged_copy_is_left_alone_and_nothing_is_hashed_again(tmp_path, monkeypatch, hashed):
    folder = local_folder(tmp_path, WHEEL, "torch_stub-1.0-py3-none-any.whl")
    copy = uploaded_state(folder)
    hashed.clear()
    commands, host = run(folder, "/opt/wheels", copy, monkeypatch=monkeypatch)
    assert commands == [] and host.noops == [f"the 2 wheels of {folder} are in /opt/wheels"]
    assert hashed == []


def test_a_wheel_changed_here_or_there_is_uploaded_again_with_its_mtime_and_the_record(tmp_path, monkeypatch, hashed):
    folder = local_folder(tmp_path, WHEEL, "torch_stub-1.0-py3-none-any.whl")
    copy = uploaded_state(folder)
    time.sleep(0.05)
    # here: the vllm wheel rebuilt at the same size; there: the other one touched on the host
    write(folder / WHEEL, b"Z" * 100, mtime_ns=1_700_000_000_000_000_000)
    copy["wheels"]["torch_stub-1.0-py3-none-any.whl"] = (101, 1_800_000_000)
    commands, _ = run(folder, "/opt/wheels", copy, monkeypatch=monkeypatch)
    assert commands[0] == "mkdir -p /opt/wheels"
    uploads = [c for c in commands if isinstance(c, list)]
    assert sorted(u[2] for u in uploads[:-1]) == ["/opt/wheels/torch_stub-1.0-py3-none-any.whl", f"/opt/wheels/{WHEEL}"]
    assert uploads[-1][2] == "/opt/wheels/.heavylift-wheelhouse.json"  # the record last, once the wheels are there
    assert f"touch -m -d @1700000000 /opt/wheels/{WHEEL}" in commands
    record = json.loads(uploads[-1][1])
    assert record[WHEEL]["sha256"] == hashlib.sha256(b"Z" * 100).hexdigest()


def test_a_wheel_the_host_lacks_is_uploaded_and_wheels_only_the_host_has_stay(tmp_path, monkeypatch):
    folder = local_folder(tmp_path, WHEEL)
    copy = {"record": {"old-1.0-py3-none-any.whl": {"sha256": "0" * 64, "size": 1, "mtime": 1}},
            "wheels": {"old-1.0-py3-none-any.whl": (1, 1)}}
    commands, _ = run(folder, "/opt/wheels", copy, monkeypatch=monkeypatch)
    assert ["upload", str(folder / WHEEL), f"/opt/wheels/{WHEEL}"] in commands
    assert not any("rm" in c for c in commands if isinstance(c, str))
    assert set(json.loads(commands[-1][1])) == {WHEEL, "old-1.0-py3-none-any.whl"}


def test_on_this_machine_the_same_folder_is_not_copied_nor_read(tmp_path, monkeypatch, hashed):
    folder = local_folder(tmp_path, WHEEL)
    monkeypatch.setattr(FakeHost, "connector_cls", LocalConnector, raising=False)
    commands, host = run_operation(runtime.wheelhouse_uploaded, {"src": str(folder), "dest": str(folder)}, {})
    assert commands == [] and host.noops == [f"the wheelhouse {folder} is this machine's own folder"]
    assert hashed == []


def test_the_host_copy_fact_reads_the_record_and_the_stat_of_each_wheel():
    fact = runtime.WheelhouseCopy()
    assert fact.command("/opt/w h").get_raw_value() == (
        "cat '/opt/w h/.heavylift-wheelhouse.json' 2>/dev/null ; echo ; find '/opt/w h' -maxdepth 1 -type f "
        "-name '*.whl' -printf '%s %T@ %f\\n' 2>/dev/null || true"
    )
    record = {WHEEL: {"sha256": "a" * 64, "size": 5, "mtime": 17}}
    assert fact.process([json.dumps(record), f"5 17.5000000000 {WHEEL}"]) == {"record": record, "wheels": {WHEEL: [5, 17]}}
    assert fact.process(["", ""]) == {"record": {}, "wheels": {}}
    assert fact.process(["{not json", f"5 17.0 {WHEEL}"])["record"] == {}
