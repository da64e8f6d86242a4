"""Checkpoint overlay on the host: links to the pristine files beside the rendered configs (resolve/overlay.py).

vLLM is pointed at the overlay, so the download stays byte-for-byte what the Hub
served and a patch is undone by rendering the overlay again without it.
``--hf-overrides`` is not used for this: it replaces dict-valued keys whole (vLLM
``vllm/config/model.py`` ``ModelConfig._apply_dict_overrides``; docs/field-notes.md), so removing one key of
``quantization_config`` would mean repeating the whole dict.
"""

from __future__ import annotations

import posixpath

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, operation

class FolderLinks(FactBase):
    """Symlinks under a folder, as {relative path: target}."""

    def command(self, path):
        return StringCommand(
            "test -d", QuoteString(path), "&&", "cd", QuoteString(path), "&&",
            "find . -type l -printf '%P\\t%l\\n'", "||", "true",
        )

    def default(self):
        return {}

    def process(self, output):
        links = {}
        for line in output:
            if "\t" in line:
                name, target = line.split("\t", 1)
                links[name] = target
        return links


@operation()
def links(path: str, target_dir: str, names: list[str]):
    """
    A folder of symlinks, one per name, pointing into ``target_dir``; stale links removed.

    + path: the overlay folder
    + target_dir: the pristine content folder
    + names: relative paths to link (rendered files excluded by the caller)
    """
    present = host.get_fact(FolderLinks, path=path)
    wanted = {name: posixpath.join(target_dir, name) for name in names}
    commands = []
    for name, target in sorted(wanted.items()):
        if present.get(name) != target:
            link = posixpath.join(path, name)
            commands.append(StringCommand("mkdir", "-p", QuoteString(posixpath.dirname(link))))
            commands.append(StringCommand("ln", "-sfn", QuoteString(target), QuoteString(link)))
    for name in sorted(set(present) - set(wanted)):
        commands.append(StringCommand("rm", "-f", QuoteString(posixpath.join(path, name))))
    if not commands:
        host.noop(f"{len(wanted)} links in {path} point at {target_dir}")
        return
    yield from commands
