"""operations/weights.py: the weights' facts run on this machine (the manifest's view of a download, the free space
where it goes) and the weights plan."""

import json
import os
import sys

import pytest

from operations.weights import FreeSpace, WeightsManifest
from pyinfra_fixtures import local_pyinfra_host


@pytest.fixture(scope="module")
def local_host():
    return local_pyinfra_host()


@pytest.fixture
def python3_on_path(tmp_path_factory, monkeypatch):
    """`python3` for the host-side scripts: this interpreter, not a slow version-manager shim."""
    bin_dir = tmp_path_factory.mktemp("bin")
    (bin_dir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def odd_dir(tmp_path):
    folder = tmp_path / "heavy lift" / "it's $HOME"
    folder.mkdir(parents=True)
    return folder


def test_weights_manifest_live(local_host, odd_dir, tmp_path, python3_on_path):
    folder = odd_dir / "content"
    (folder / "sub dir").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "sub dir" / "model.safetensors").write_bytes(b"x" * 100)
    # huggingface_hub's metadata and partial files are not content
    (folder / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (folder / ".cache" / "huggingface" / "download" / "ab.etag.incomplete").write_bytes(b"y" * 7)
    manifest = tmp_path / "mani fests" / "it's.json"
    manifest.parent.mkdir()
    args = {"manifest": str(manifest), "folder": str(folder)}
    present = {"config.json": 2, "sub dir/model.safetensors": 100}
    partial = {"ab.etag.incomplete": 7}  # counted apart, for the disk preflight

    assert local_host.get_fact(WeightsManifest, manifest=str(manifest), folder=str(tmp_path / "nothing")) == {
        "state": "absent", "present": {}, "partial": {},
    }
    assert local_host.get_fact(WeightsManifest, **args) == {"state": "absent", "present": present, "partial": partial}
    manifest.write_text("{not json")
    assert local_host.get_fact(WeightsManifest, **args) == {"state": "absent", "present": present, "partial": partial}

    entries = {}
    for name in ("config.json", "sub dir/model.safetensors"):
        st = (folder / name).stat()
        entries[name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": "0" * 64}
    manifest.write_text(json.dumps({"repo": "org/m", "commit": "0" * 40, "files": entries}))
    assert local_host.get_fact(WeightsManifest, **args) == {
        "state": "complete", "changed": [], "files": ["config.json", "sub dir/model.safetensors"], "bytes": 102,
        "present": present, "partial": partial,
    }

    os.utime(folder / "config.json", ns=(1, 1))  # same size, another mtime: an edit
    (folder / "sub dir" / "model.safetensors").unlink()
    assert local_host.get_fact(WeightsManifest, **args) == {
        "state": "changed", "changed": ["config.json", "sub dir/model.safetensors"],
        "files": ["config.json", "sub dir/model.safetensors"], "bytes": 102, "present": {"config.json": 2},
        "partial": partial,
    }


def test_free_space_live(local_host, odd_dir):
    """df of the nearest existing parent: the same numbers os.statvfs gives (f_bavail, as df's Available)."""
    target = odd_dir / "models" / "org--m" / ("0" * 40)
    fact = local_host.get_fact(FreeSpace, path=str(target))
    assert fact["path"] == str(odd_dir)
    vfs = os.statvfs(odd_dir)
    assert abs(fact["free_bytes"] - vfs.f_bavail * vfs.f_frsize) < 64 * 1024 * 1024  # others write meanwhile
    assert fact["total_bytes"] >= fact["free_bytes"] > 0
    target.mkdir(parents=True)
    assert local_host.get_fact(FreeSpace, path=str(target))["path"] == str(target)
