"""Checkpoint overlay: links to the pristine files plus patched, rendered config files.

vLLM is pointed at the overlay, so the download stays byte-for-byte what the Hub
served and a patch is undone by rendering the overlay again without it.
``--hf-overrides`` is not used for this: it replaces dict-valued keys whole (FACTS,
vLLM 0.16-0.34 ``vllm/config/model.py``), so removing one key of
``quantization_config`` would mean repeating the whole dict.
"""

from __future__ import annotations

import copy
import json
import posixpath
from functools import lru_cache
from typing import Any

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, operation

from resolve import plancache

# the checkpoint files heavylift renders instead of linking
RENDERED_FILES = {"config.json": "config_json", "hf_quant_config.json": "hf_quant_config_json"}


class PatchError(ValueError):
    pass


def _walk(document: dict, dotted: str, create: bool = False):
    keys = dotted.split(".")
    node = document
    for key in keys[:-1]:
        if key not in node and create:
            node[key] = {}
        node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return None, keys[-1]
    return node, keys[-1]


def apply_patch(pristine: dict, remove: list[str], set_values: dict[str, Any]) -> dict:
    """The pristine document with dotted keys removed and set; the input is not modified.

    Removing a key that is absent is not an error: a patch describes the state to
    reach, and a checkpoint revision without the key already has it.
    """
    patched = copy.deepcopy(pristine)
    for dotted in remove:
        parent, key = _walk(patched, dotted)
        if parent is not None:
            parent.pop(key, None)
    for dotted, value in set_values.items():
        parent, key = _walk(patched, dotted, create=True)
        if parent is None:
            raise PatchError(f"cannot set {dotted}: a parent key is not a mapping")
        parent[key] = value
    return patched


def render_json(document: dict) -> str:
    # stable text: a re-render of the same document gives the same bytes (no diff, no restart)
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


@lru_cache(maxsize=None)
def fetch_pristine_json(repo: str, commit: str, filename: str, endpoint: str | None, refresh: bool = False) -> dict | None:
    """A small config file of the pinned commit, fetched alone on the control machine; a full commit's is
    kept there (resolve/plancache.py): it cannot change."""

    def fetch() -> dict:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(repo, filename, revision=commit, endpoint=endpoint)
        with open(path) as handle:
            return json.load(handle)

    if not plancache.FULL_COMMIT.match(commit):
        return fetch()
    key = {"endpoint": plancache.hub_endpoint(endpoint), "repo": repo, "commit": commit, "file": filename}
    return plancache.kept("hub-file", key, fetch, refresh)


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
