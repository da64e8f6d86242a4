"""operations/weights.py: the weights' facts run on this machine (the manifest's view of a download, the free space
where it goes), the plan line the download logs and the preflight (the plan itself: tests/test_resolve_weights.py)."""

import json
import logging
import os

import pytest

from operations.weights import FreeSpace, WeightsManifest
from pyinfra_fixtures import run_operation


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


def plan_case(present, free_gb):
    commit = "0123456789abcdef0123456789abcdef01234567"
    local_dir, manifest = f"/r/models/org--m/{commit}", f"/r/models/org--m/{commit}.manifest.json"
    files = [{"path": "a.safetensors", "size": 3 * 10**9, "sha256": None}, {"path": "b.safetensors", "size": 10**9, "sha256": None}]
    request = manifest.removesuffix(".json") + ".request.json"
    facts = {
        "weights.WeightsManifest": {f"folder={local_dir}, manifest={manifest}": {"state": "absent", "present": present}},
        "weights.FreeSpace": {f"path={local_dir}": {"path": "/r", "free_bytes": int(free_gb * 1e9), "total_bytes": 10**12}},
        "files.File": {f"path={request}": None},
        "files.Directory": {f"path={request}": None, "path=/r/models/org--m": None},
    }
    kwargs = {"snapshot": {"repo": "org/m", "commit": commit, "files": files}, "local_dir": local_dir,
              "manifest": manifest, "python": "/p", "script_dir": "/s"}
    return kwargs, facts


def test_plan_line_logged_at_prepare_not_while_executing(caplog):
    from operations import weights

    kwargs, facts = plan_case({"a.safetensors": 3 * 10**9}, 30)
    caplog.set_level(logging.INFO, logger="pyinfra")
    run_operation(weights.downloaded, kwargs, facts)
    assert [r.getMessage() for r in caplog.records if "weights" in r.getMessage()] == [
        "weights org/m@0123456789ab: 1 files, 1.0 GB to fetch, 1 files to re-verify, 29.0 GB free after on /r"
    ]
    caplog.clear()
    run_operation(weights.downloaded, kwargs, facts, executing=True)
    assert not [r for r in caplog.records if "weights" in r.getMessage()]


def test_preflight_raises_before_any_operation():
    from pyinfra.api import OperationError
    from pyinfra.context import ctx_host, ctx_state

    from operations import weights
    from pyinfra_fixtures import FakeHost, FakeState, coerce

    kwargs, facts = plan_case({}, 10)
    snapshot = coerce(kwargs["snapshot"], weights.Snapshot)
    with ctx_state.use(FakeState()), ctx_host.use(FakeHost(facts)):
        with pytest.raises(OperationError, match=r"^testhost: org/m@0123456789ab: 4\.0 GB still to download but /r has 10\.0 GB free \(margin 20 GB\)"):
            weights.preflight(snapshot, kwargs["local_dir"], kwargs["manifest"])
        plan = weights.preflight(snapshot, kwargs["local_dir"], kwargs["manifest"], disk_margin_gb=0.5)
    assert plan.fetch_bytes == 4 * 10**9 and plan.headroom_after == 6 * 10**9
