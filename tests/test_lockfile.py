"""The lock file against a real Hub mirror: a branch is resolved once, then read from the lock."""

import json
import sys

import pytest

from resolve import lockfile
from testbed.hub_mirror import publish_repo
from testbed.tiny_model import write_tiny_llama


@pytest.fixture
def lock(tmp_path, monkeypatch):
    path = tmp_path / "site.lock.json"
    monkeypatch.setenv("HEAVYLIFT_LOCK_FILE", str(path))
    monkeypatch.setattr(lockfile, "_locks", {})
    return path


@pytest.fixture
def moving_repo(hub_mirror, tmp_path):
    """A repo of its own whose main branch the test moves."""
    src = tmp_path / "src"
    write_tiny_llama(src)
    first = publish_repo(hub_mirror.dir, "heavylift/moving", src)
    return hub_mirror, src, first


def test_branch_is_resolved_once_and_pinned_until_refresh(lock, moving_repo, monkeypatch):
    mirror, src, first = moving_repo
    assert lockfile.hub_commit("heavylift/moving", "main", mirror.url, refresh=False) == first
    recorded = json.loads(lock.read_text())["resolved"]
    assert [entry["commit"] for entry in recorded.values()] == [first]

    # main moves on the Hub; the lock keeps every host and every run on the first commit
    (src / "README.md").write_text("a new revision\n")
    second = publish_repo(mirror.dir, "heavylift/moving", src)
    assert second != first
    monkeypatch.setattr(lockfile, "_locks", {})
    assert lockfile.hub_commit("heavylift/moving", "main", mirror.url, refresh=False) == first

    # refresh_lock resolves again and records the new commit
    assert lockfile.hub_commit("heavylift/moving", "main", mirror.url, refresh=True) == second
    recorded = json.loads(lock.read_text())["resolved"]
    assert [entry["commit"] for entry in recorded.values()] == [second]


def test_pinned_commit_needs_no_lookup_and_no_lock(lock):
    sha = "0123456789abcdef0123456789abcdef01234567"
    assert lockfile.hub_commit("org/anything", sha, "http://127.0.0.1:9", refresh=False) == sha
    assert not lock.exists()


def test_dry_run_resolves_but_writes_nothing(lock, moving_repo, monkeypatch):
    mirror, _, first = moving_repo
    monkeypatch.setattr(sys, "argv", ["pyinfra", "inventory/site.py", "deploy.py", "--dry"])
    assert lockfile.hub_commit("heavylift/moving", "main", mirror.url, refresh=False) == first
    assert not lock.exists()


def test_lock_beside_the_inventory(tmp_path, monkeypatch):
    inventory = tmp_path / "inventory" / "site.py"
    inventory.parent.mkdir()
    inventory.write_text("hosts = []\n")
    monkeypatch.delenv("HEAVYLIFT_LOCK_FILE", raising=False)
    monkeypatch.setattr(sys, "argv", ["pyinfra", str(inventory), "deploy.py"])
    assert lockfile.lock_path() == inventory.with_suffix(".lock.json")


def test_corrupt_lock_names_the_file_and_the_fix(lock):
    lock.write_text("{not json")
    with pytest.raises(lockfile.LockFileError, match="site.lock.json: the lock file is not valid JSON.*delete it"):
        lockfile.LockFile(lock)
