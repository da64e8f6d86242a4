"""operations/permissions.py: the fact's command and the operation's commands run in a real shell on
a real tree made the way a hardened host (umask 077) makes it. The whole deploy at umask 077, over
SSH, serving as the service user, is tests/test_e2e_systemd.py."""

import os
import stat
import subprocess

import pytest

from operations import permissions
from pyinfra_fixtures import FakeHost


def run(command) -> list[str]:
    text = command.get_raw_value() if hasattr(command, "get_raw_value") else command
    done = subprocess.run(["sh", "-c", text], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def hardened(tmp_path):
    """root/venvs/v (a venv-like tree), root/models/m, root/private (secrets: must stay 0700), made at umask 077."""
    old = os.umask(0o077)
    try:
        root = tmp_path / "heavy lift %s"  # a space and a printf directive: quoted, never a format
        venv = root / "venvs" / "v"
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").write_text("#!/bin/sh\n")
        (venv / "bin" / "python").chmod(0o700)
        (venv / "lib").mkdir()
        (venv / "lib" / "module.py").write_text("x = 1\n")
        (venv / "outside").symlink_to(root / "private" / "serve.env")
        models = root / "models" / "m"
        models.mkdir(parents=True)
        (models / "model.safetensors").write_bytes(b"\0" * 8)
        (root / "private").mkdir()
        (root / "private" / "serve.env").write_text("VLLM_API_KEY=secret\n")
    finally:
        os.umask(old)
    return root


def real_fact(fact_cls, **kwargs):
    """host.get_fact, answered by running the fact's command here."""
    fact = fact_cls()
    return fact.process(run(fact.command(**kwargs)))


def look(root):
    trees = [str(root / "venvs" / "v"), str(root / "models" / "m"), str(root / "missing")]
    folders = [str(root), str(root / "venvs"), str(root / "models"), str(root / "not-there")]
    fact = permissions.NotReadableByOthers()
    return trees, folders, fact.process(run(fact.command(trees, folders)))


def test_a_tree_made_at_umask_077_is_found_and_made_readable_and_nothing_else_changes(hardened, monkeypatch):
    trees, folders, found = look(hardened)
    assert found == {"trees": trees[:2], "folders": folders[:3]}  # missing paths are not errors

    host = FakeHost({})
    host.get_fact = real_fact
    monkeypatch.setattr(permissions, "host", host)
    commands = list(permissions.readable_by_service._inner(trees=trees, root=str(hardened)))
    for command in commands:
        run(command)

    assert look(hardened)[2] == {"trees": [], "folders": []}
    venv = hardened / "venvs" / "v"
    assert mode(venv) == 0o755 and mode(venv / "bin" / "python") == 0o755  # X: executables stay executable
    assert mode(venv / "lib" / "module.py") == 0o644  # and data files do not become executable
    assert mode(hardened / "models" / "m" / "model.safetensors") == 0o644
    # the secrets were reachable through a link inside a tree: links are not followed
    assert mode(hardened / "private") == 0o700 and mode(hardened / "private" / "serve.env") == 0o600
    # nothing above heavylift's root is opened (pytest made it 0700)
    assert mode(hardened.parent) == 0o700


def test_a_tree_opened_when_built_is_not_searched_only_its_folders_opened(hardened, monkeypatch):
    """A venv (runtime.venv opens it once, as it is built) is never searched again: its own folder and those
    on the way to it are checked, its content is left as it is."""
    host = FakeHost({})
    host.get_fact = real_fact
    monkeypatch.setattr(permissions, "host", host)
    venv = hardened / "venvs" / "v"
    commands = list(permissions.readable_by_service._inner(
        trees=[str(hardened / "models" / "m")], root=str(hardened), opened_when_built=[str(venv)]))
    for command in commands:
        run(command)
    assert mode(hardened / "venvs") == 0o755 and mode(venv) == 0o755  # entered
    assert mode(venv / "lib" / "module.py") == 0o600  # not searched: the build opened it (or did not)
    assert mode(hardened / "models" / "m" / "model.safetensors") == 0o644
    assert not any("-R" in str(c) and "venvs" in str(c) for c in commands)


def test_readable_trees_are_a_noop(tmp_path, monkeypatch):
    tmp_path.chmod(0o755)  # pytest makes it 0700
    (tmp_path / "v").mkdir(mode=0o755)
    (tmp_path / "v" / "f").write_text("x")
    (tmp_path / "v" / "f").chmod(0o644)
    fact = permissions.NotReadableByOthers()
    found = fact.process(run(fact.command([str(tmp_path / "v")], [str(tmp_path)])))
    assert found == {"trees": [], "folders": []}
    host = FakeHost({})
    host.get_fact = real_fact
    monkeypatch.setattr(permissions, "host", host)
    assert list(permissions.readable_by_service._inner(trees=[str(tmp_path / "v")], root=str(tmp_path))) == []
    assert host.noops == ["1 trees and 1 folders are readable by the service user"]


def test_folders_above_stop_at_the_parent_of_heavylifts_root():
    assert permissions.folders_above("/opt/heavylift/models/org--m/abc", stop="/opt") == [
        "/opt/heavylift", "/opt/heavylift/models", "/opt/heavylift/models/org--m",
    ]
    assert permissions.folders_above("/opt/heavylift/lib", stop="/opt") == ["/opt/heavylift"]
