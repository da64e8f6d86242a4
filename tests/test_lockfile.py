"""The lock file against a real Hub mirror: a branch is resolved once, then read from the lock."""

import json

import pytest

from resolve import lockfile
from resolve.context import RunContext
from resolve.hub import HubClient
from testbed.hub_mirror import publish_repo
from testbed.tiny_model import write_tiny_llama


@pytest.fixture
def lock(tmp_path):
    return tmp_path / "site.lock.json"


@pytest.fixture
def moving_repo(hub_mirror, tmp_path):
    """A repo of its own whose main branch the test moves."""
    src = tmp_path / "src"
    write_tiny_llama(src)
    first = publish_repo(hub_mirror.dir, "heavylift/moving", src)
    return hub_mirror, src, first


def test_branch_is_resolved_once_and_pinned_until_refresh(lock, moving_repo):
    mirror, src, first = moving_repo
    hub = HubClient(mirror.url)
    assert lockfile.hub_commit(lockfile.LockFile(lock), hub, "heavylift/moving", "main", refresh=False) == first
    recorded = json.loads(lock.read_text())["resolved"]
    assert [entry["commit"] for entry in recorded.values()] == [first]

    # main moves on the Hub; the lock keeps every host and every run on the first commit
    (src / "README.md").write_text("a new revision\n")
    second = publish_repo(mirror.dir, "heavylift/moving", src)
    assert second != first
    assert lockfile.hub_commit(lockfile.LockFile(lock), hub, "heavylift/moving", "main", refresh=False) == first

    # refresh_lock resolves again and records the new commit
    assert lockfile.hub_commit(lockfile.LockFile(lock), hub, "heavylift/moving", "main", refresh=True) == second
    recorded = json.loads(lock.read_text())["resolved"]
    assert [entry["commit"] for entry in recorded.values()] == [second]


def test_pinned_commit_needs_no_lookup_and_no_lock(lock):
    sha = "0123456789abcdef0123456789abcdef01234567"
    assert lockfile.hub_commit(lockfile.LockFile(lock), HubClient("http://127.0.0.1:9"), "org/anything", sha, refresh=False) == sha
    assert not lock.exists()


def test_dry_run_resolves_but_writes_nothing(lock, moving_repo, tmp_path):
    mirror, _, first = moving_repo
    context = RunContext.build(tmp_path, ["inventory/site.py", "deploy.py", "--dry"], environ={"HEAVYLIFT_LOCK_FILE": str(lock)})
    assert context.dry and context.lock_file == lock
    dry_lock = lockfile.LockFile(context.lock_file, context.dry)
    assert lockfile.hub_commit(dry_lock, HubClient(mirror.url), "heavylift/moving", "main", refresh=False) == first
    assert not lock.exists()


def test_lock_beside_the_inventory(tmp_path):
    inventory = tmp_path / "inventory" / "site.py"
    inventory.parent.mkdir()
    inventory.write_text("hosts = []\n")
    context = RunContext.build(tmp_path, [str(inventory), "deploy.py"], environ={})
    assert context.lock_file == inventory.with_suffix(".lock.json")
    # relative to the folder pyinfra runs in (after --chdir), as pyinfra opens the inventory
    assert RunContext.build(tmp_path, ["-y", "inventory/site.py", "deploy.py"], environ={}).lock_file == inventory.with_suffix(".lock.json")


def test_corrupt_lock_names_the_file_and_the_fix(lock):
    lock.write_text("{not json")
    with pytest.raises(lockfile.LockFileError, match="site.lock.json: the lock file is not valid JSON.*delete it"):
        lockfile.LockFile(lock)
