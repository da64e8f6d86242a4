"""operations/checkpoint.py: the overlay folder's links into the Hub cache, made by a shell on this machine and
read back by the FolderLinks fact (paths with spaces, quotes and $)."""



from operations import checkpoint
from operations.checkpoint import FolderLinks
from pyinfra_fixtures import run_operation, sh


def test_links_commands_converge(local_host, odd_dir):
    content = odd_dir / "hub cache" / "commit"
    (content / "sub dir").mkdir(parents=True)
    names = ["weights 1.safetensors", "tok'en.json", "sub dir/vocab $1.txt"]
    for name in names:
        (content / name).write_text(name)
    overlay = odd_dir / "over lay"
    overlay.mkdir()
    (overlay / "tok'en.json").symlink_to("/older/commit/tok'en.json")
    (overlay / "stale $HOME.json").symlink_to("/older/commit/stale.json")
    (overlay / "config.json").write_text("{}")  # rendered, not a link: left alone

    def links_run():
        facts = {"checkpoint.FolderLinks": {f"path={overlay}": local_host.get_fact(FolderLinks, path=str(overlay))}}
        return run_operation(checkpoint.links, {"path": str(overlay), "target_dir": str(content), "names": names}, facts)

    commands, _ = links_run()
    assert len(commands) == 7
    for command in commands:
        sh(command)
    assert {n: (overlay / n).read_text() for n in names} == {n: n for n in names}
    assert sorted(p.name for p in overlay.iterdir()) == ["config.json", "sub dir", "tok'en.json", "weights 1.safetensors"]

    commands, host = links_run()
    assert (commands, host.noops) == ([], [f"3 links in {overlay} point at {content}"])


def test_folder_links_live(local_host, odd_dir):
    overlay = odd_dir / "over lay"
    assert local_host.get_fact(FolderLinks, path=str(overlay)) == {}
    (overlay / "sub dir").mkdir(parents=True)
    (overlay / "config.json").write_text("{}")  # a rendered file, not a link
    (overlay / "weights 1.safetensors").symlink_to("/hub cache/it's/weights 1.safetensors")
    (overlay / "sub dir" / "vocab.txt").symlink_to("../relative")
    assert local_host.get_fact(FolderLinks, path=str(overlay)) == {
        "weights 1.safetensors": "/hub cache/it's/weights 1.safetensors",
        "sub dir/vocab.txt": "../relative",
    }
