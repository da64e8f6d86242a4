"""The model catalog: one YAML file per checkpoint, ``models/<name>.yaml``, read into a CatalogEntry.

The catalog folder is ``models/`` of this repository. Set ``HEAVYLIFT_CATALOG=/some/folder``
(or pass ``catalog_dir=``) to read entries from another folder instead: a site's own
entries, or a test's. Every problem raises ``HeavyliftConfigError`` naming the file, the
line where YAML can tell, the field and a fix.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from .errors import HeavyliftConfigError, closest, combine, display_path, explain_error, model_at
from .schema import CatalogEntry

DEFAULT_CATALOG = Path(__file__).resolve().parent
CATALOG_ENV = "HEAVYLIFT_CATALOG"
# a catalog name is the default deployment name, so it obeys the same rule (schema.SLUG)
ENTRY_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
SMALL_EXAMPLE = "models/tiny-llama.yaml"

# how to fix a bad value, by dotted field path (the most specific one wins): only where the fix says more than the
# schema's Field(description=...) (a rule over several fields, YAML's quoting); every other field's fix is built from
# the schema (catalog_hints), the one place a field is described
CATALOG_FIXES: dict[str, str] = {
    "": "add a hub.allow_patterns entry that matches the weight files (e.g. '*.safetensors', or 'Q4_K_M/*.gguf' for a GGUF "
    "quant folder); a GGUF entry also names its tokenizer repo in serve.extra_args: ['--tokenizer', 'org/base-model']",
    "hub.revision": 'give a branch or tag (revision: main) or a full 40-hex commit in quotes (revision: "<40 hex digits>") '
    "so that YAML keeps it a string",
    "serve.env": "map environment variable names to quoted strings, e.g. VLLM_CPU_KVCACHE_SPACE: \"1\"",
}


@lru_cache(maxsize=1)
def catalog_hints() -> dict[str, str]:
    """A fix for every field of a catalog entry, from the schema (as models/validate.py ``schema_hints`` for a site's):
    a field's description, choices, bounds and default; a mapping's keys and what it is; then CATALOG_FIXES."""
    # imported here: `python -m models.settings_doc` runs that module after models/__init__ imported this one
    from .settings_doc import field_fix, mapping_fix

    hints: dict[str, str] = {}

    def add(model: type[BaseModel], under: str) -> None:
        for name, field in model.model_fields.items():
            path = f"{under}.{name}" if under else name
            nested = model_at(model, (name,))
            hints[path] = mapping_fix(path, nested, field.description) if nested else field_fix(path, field)
            if nested:
                add(nested, path)

    add(CatalogEntry, "")
    return {**hints, **CATALOG_FIXES}


def catalog_folder(catalog_dir: str | os.PathLike | None = None) -> Path:
    """The catalog folder: the argument, else $HEAVYLIFT_CATALOG, else models/ of this repository."""
    if catalog_dir is not None:
        return Path(catalog_dir)
    from_env = os.environ.get(CATALOG_ENV)
    return Path(from_env) if from_env else DEFAULT_CATALOG


def _check_folder(folder: Path) -> None:
    if not folder.is_dir():
        origin = f" (from ${CATALOG_ENV})" if os.environ.get(CATALOG_ENV) == str(folder) else ""
        raise HeavyliftConfigError(
            f"the model catalog folder {display_path(folder)}{origin} does not exist. "
            f"Fix: point ${CATALOG_ENV} at a folder of <name>.yaml files, or unset it to use models/ of heavylift."
        )


def list_entries(catalog_dir: str | os.PathLike | None = None) -> list[str]:
    """The names of the catalog entries (file names without .yaml), sorted."""
    folder = catalog_folder(catalog_dir)
    _check_folder(folder)
    return sorted(path.stem for path in folder.glob("*.yaml") if path.is_file() and ENTRY_NAME.match(path.stem))


def entry_path(name: str, catalog_dir: str | os.PathLike | None = None) -> Path:
    return catalog_folder(catalog_dir) / f"{name}.yaml"


def unknown_model(name: Any, catalog_dir: str | os.PathLike | None = None) -> str:
    """Why ``name`` is no catalog entry, and what to write instead (no file prefix)."""
    folder = catalog_folder(catalog_dir)
    known = list_entries(folder)
    guess = closest(str(name), known)
    mean = f" (did you mean {guess!r}?)" if guess else ""
    listing = ", ".join(known) if known else "none"
    wanted = folder / f"{name}.yaml"
    extra = ""
    if isinstance(name, str) and (folder / f"{name}.yml").is_file():
        extra = f" ({display_path(folder / f'{name}.yml')} exists: catalog files end in .yaml)"
    elif isinstance(name, str) and (folder / f"{name}.yaml").is_file():
        extra = " (its file name is not a valid entry name: lower-case letters, digits, '.', '_', '-')"
    return (
        f"unknown model {short(name)}{mean}: there is no {display_path(wanted)}{extra}; "
        f"catalog models: {listing}. Fix: set model to one of these names, or add {display_path(wanted)}."
    )


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 70 else text[:67] + "..."


def load_entry(name: str, catalog_dir: str | os.PathLike | None = None) -> CatalogEntry:
    """The validated catalog entry ``<catalog>/<name>.yaml``."""
    folder = catalog_folder(catalog_dir)
    _check_folder(folder)
    if not isinstance(name, str) or not ENTRY_NAME.match(name) or not (folder / f"{name}.yaml").is_file():
        raise HeavyliftConfigError(unknown_model(name, folder))
    return load_entry_file(folder / f"{name}.yaml")


# ---------------------------------------------------------------- YAML


class _Loader(yaml.SafeLoader):
    """yaml.safe_load's loader, but a key given twice in one mapping is an error, not 'last one wins'."""


def _mapping_without_duplicates(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, yaml.Mark] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            first = seen.get(key)
        except TypeError:
            continue  # an unhashable key: the constructor reports it
        if first is not None:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"found the key {key!r} twice (first on line {first.line + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def _line_of(text: str, loc: tuple, key_itself: bool) -> int | None:
    """1-based line of the value at ``loc`` in the YAML text (of the key, for an unknown key or a block)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    if node is None:
        return None
    line = node.start_mark.line
    for index, part in enumerate(loc):
        last = index == len(loc) - 1
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == part), None)
            if match is None:
                break  # a missing key: the line of the mapping that lacks it
            key_node, value_node = match
            block = isinstance(value_node, (yaml.MappingNode, yaml.SequenceNode))
            line = key_node.start_mark.line if (last and key_itself) or block else value_node.start_mark.line
            node = value_node
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line
        else:
            break
    return line + 1


def _yaml_problem(shown: str, text: str, err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    context = getattr(err, "context", None)
    where = f"{shown} line {mark.line + 1}, column {mark.column + 1}" if mark else shown
    lines = text.splitlines()
    bad_line = lines[mark.line] if mark and mark.line < len(lines) else ""
    if "twice" in problem:
        fix = "keep one of the two keys (YAML would silently use the last one)"
    elif "\t" in bad_line or "'\\t'" in problem:
        fix = f"indent line {mark.line + 1} with spaces: YAML does not allow tabs"
    else:
        line_no = mark.line + 1 if mark else "the reported"
        fix = (
            f"check the indentation, colons and quoting on line {line_no} and the line before it "
            "(a value containing ': ' or starting with '*', '&', '{' or '[' needs quotes)"
        )
    detail = f"{problem} ({context})" if context else problem
    return f"{where}: this is not valid YAML: {detail}. Fix: {fix}."


def load_entry_file(path: str | os.PathLike) -> CatalogEntry:
    """Read and validate one catalog file."""
    path = Path(path)
    shown = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        message = f"{shown}: not UTF-8 text ({err.reason} at byte {err.start}). Fix: save it as UTF-8."
        raise HeavyliftConfigError(message) from None
    except OSError as err:
        message = f"{shown}: cannot be read ({err.strerror}). Fix: check the file and its permissions."
        raise HeavyliftConfigError(message) from None

    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        raise HeavyliftConfigError(_yaml_problem(shown, text, err)) from None

    if data is None:
        raise HeavyliftConfigError(
            f"{shown} is empty. Fix: write the entry's keys (description, hub, serve, ...); "
            f"{SMALL_EXAMPLE} is a small example."
        )
    if not isinstance(data, dict):
        kind = {list: "a list", str: "a single string"}.get(type(data), f"a {type(data).__name__}")
        raise HeavyliftConfigError(
            f"{shown} line 1: the top level is {kind}, but a catalog entry is a mapping of keys "
            f"(description, hub, serve, ...). Fix: write 'key: value' lines at the top level; "
            f"{SMALL_EXAMPLE} is a small example."
        )

    try:
        return CatalogEntry.model_validate(data)
    except ValidationError as err:
        problems = []
        for error in err.errors():
            loc = tuple(error["loc"])
            line = _line_of(text, loc, key_itself=error["type"] == "extra_forbidden")
            where = f"{shown} line {line}" if line else shown
            problems.append(f"{where}: {explain_error(error, CatalogEntry, catalog_hints())}")
        raise combine(problems, what=shown) from None
