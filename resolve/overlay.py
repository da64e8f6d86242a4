"""The checkpoint overlay's rendered configs: the pristine JSON with dotted keys removed and set.

vLLM is pointed at the overlay (operations/checkpoint.py builds it on the host), so the download stays
byte-for-byte what the Hub served and a patch is undone by rendering the overlay again without it.
``--hf-overrides`` is not used for this: it replaces dict-valued keys whole (vLLM 0.16-0.34
``vllm/config/model.py``), so removing one key of ``quantization_config`` would mean repeating the whole dict.
"""

from __future__ import annotations

import copy
import json
from typing import Any

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
