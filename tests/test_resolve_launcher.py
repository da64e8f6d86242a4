"""resolve/launcher.py: the release's launcher script and the id that names a release."""

from resolve import launcher


def test_release_id_changes_with_each_part():
    base = launcher.release_id("/v/a", "launcher", {"content": "c"})
    assert base == launcher.release_id("/v/a", "launcher", {"content": "c"})
    assert len({base, launcher.release_id("/v/b", "launcher", {"content": "c"}),
                launcher.release_id("/v/a", "launcher2", {"content": "c"}),
                launcher.release_id("/v/a", "launcher", {"content": "d"})}) == 4
