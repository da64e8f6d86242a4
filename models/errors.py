"""heavylift's configuration error and the wording of its messages.

Every bad input stops the run with a ``HeavyliftConfigError`` whose message names the
file the value came from, the field, what is wrong and how to fix it.
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pyinfra.api.exceptions import DeployError


class HeavyliftConfigError(DeployError):
    """A bad inventory value or catalog entry; raised before any host is changed.

    A subclass of pyinfra's ``DeployError``: raised while pyinfra loads ``deploy.py`` (its
    prepare phase, before anything runs on a host), the pyinfra CLI prints it as
    ``--> pyinfra error: <message>`` and exits with status 1, without a traceback.

    ``problems`` holds the individual problems (one line each); the message is all of them.
    """

    def __init__(self, message: str, problems: Sequence[str] | None = None):
        super().__init__(message)
        self.message = message
        self.problems: list[str] = list(problems) if problems else [message]

    # pyinfra 3.10's CLI (pyinfra_cli/exceptions.py, WrappedError.show) prefixes the message
    # with the innermost non-pyinfra frame of ``e.__traceback__``: "pyinfra error in
    # /.../models/validate.py line 212: ...". That names heavylift's own code, not the
    # user's file the message is about. For this class, reading ``__traceback__`` from
    # Python gives None, so the CLI prints just "pyinfra error: <message>". The interpreter
    # keeps the real traceback: sys.exc_info(), uncaught-exception printing, logging and
    # pytest still show where the error was raised.
    @property  # type: ignore[override]
    def __traceback__(self):  # noqa: D105
        return None

    @__traceback__.setter
    def __traceback__(self, value):
        BaseException.__traceback__.__set__(self, value)  # type: ignore[attr-defined]


def combine(problems: Sequence[str], what: str = "the inventory and model catalog") -> HeavyliftConfigError:
    """One error for one or many problems; several are listed one per line."""
    problems = list(dict.fromkeys(problems))  # same text once, order kept
    if len(problems) == 1:
        return HeavyliftConfigError(problems[0], problems)
    lines = "\n".join(f"  - {problem}" for problem in problems)
    return HeavyliftConfigError(f"{len(problems)} problems in {what}; no host was changed:\n{lines}", problems)


# ---------------------------------------------------------------- paths and values


def display_path(path: str | Path, cwd: str | Path | None = None) -> str:
    """A path as the user would type it: relative to the working folder when inside it."""
    base = Path(cwd) if cwd else Path.cwd()
    absolute = Path(os.path.normpath(base / path))
    try:
        return str(absolute.relative_to(Path(os.path.normpath(base))))
    except ValueError:
        try:
            return str(absolute.resolve().relative_to(base.resolve()))
        except (ValueError, OSError):
            return str(absolute)


# a name that says its value is a secret (--api-key, HF_TOKEN, db_password): its value is never shown. "token"
# as a word of its own only: a count of tokens (benchmark_tokens, --max-num-batched-tokens) or a --tokenizer is
# no secret, and hiding it hid the value a message was about
SECRET_NAME = re.compile(r"key|token(?![a-z])|secret|passw", re.IGNORECASE)
HIDDEN = "<hidden>"


# an argument and the value written with it in one item: "--api-key=VALUE", "--api-key VALUE"
_FLAG_AND_VALUE = re.compile(r"(-[^=\s]*)(=|\s+)")


def redacted(name: str, value: Any) -> Any:
    """``value`` as a message may show it: the values of secret-like names replaced by <hidden>.

    A secret-like name hides whatever it holds (a list or a dict given for a token is the token still).
    Otherwise a list is read as command-line arguments (``--api-key VALUE``, ``--api-key=VALUE``,
    ``"--api-key VALUE"`` as one item), a dict as names and values (env); ``name`` is the field's own
    path (``env.HF_TOKEN``).
    """
    if SECRET_NAME.search(name.rsplit(".", 1)[-1]):
        return HIDDEN
    if isinstance(value, dict):
        return {k: HIDDEN if SECRET_NAME.search(str(k)) else redacted(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        shown, hide_next = [], False
        for item in value:
            text = str(item)
            joined = _FLAG_AND_VALUE.match(text) if text.startswith("-") else None
            if hide_next and not text.startswith("--"):
                shown.append(HIDDEN)
            elif joined and SECRET_NAME.search(joined.group(1)):
                shown.append(f"{joined.group(1)}{joined.group(2)}{HIDDEN}")
            else:
                shown.append(item)
            hide_next = text.startswith("-") and joined is None and bool(SECRET_NAME.search(text))
        return type(value)(shown)
    return value


def short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_ARTICLE_TYPES = {
    bool: "a boolean",
    int: "an int",
    float: "a float",
    str: "a string",
    list: "a list",
    tuple: "a tuple",
    dict: "a dict",
    type(None): "None",
}


def describe_value(value: Any) -> str:
    kind = _ARTICLE_TYPES.get(type(value), f"a {type(value).__name__}")
    return f"{short_repr(value)}, {kind}" if value is not None else "None"


def _edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance: insertions, deletions, substitutions, adjacent swaps."""
    rows = [list(range(len(b) + 1))]
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            row[j] = min(rows[i - 1][j] + 1, row[j - 1] + 1, rows[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], rows[i - 2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice the user most likely meant by ``word`` (a typo, a swap, a prefix), or None."""
    word = str(word)
    choices = list(choices)
    if not choices or not word:
        return None
    lowered = {choice.lower(): choice for choice in choices}
    if word.lower() in lowered:
        return lowered[word.lower()]
    scored = sorted(
        (_edit_distance(word.lower(), choice.lower()), -difflib.SequenceMatcher(None, word, choice).ratio(), choice)
        for choice in choices
    )
    distance, _, best = scored[0]
    if distance <= max(1, min(3, len(word) // 3)):
        return best
    containing = [choice for choice in choices if word.lower() in choice.lower()]
    if len(containing) == 1:
        return containing[0]
    matches = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return matches[0] if matches else None


# ---------------------------------------------------------------- pydantic errors


def loc_path(loc: Sequence[str | int]) -> str:
    """('vllm', 'version') -> 'vllm.version'; ('extra_args', 2) -> 'extra_args[2]'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _unwrap_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _unwrap_model(arg)
            if found:
                return found
    return None


def model_at(model: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at ``loc`` (None if it is no model)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None or isinstance(part, int) or part not in current.model_fields:
            return None
        current = _unwrap_model(current.model_fields[part].annotation)
    return current


def _nested_home(model: type[BaseModel], key: str) -> str | None:
    """Where a key given at the wrong level belongs: 'version' or 'vllm_version' at the top of
    SiteSettings -> 'vllm.version' (a field of a nested model)."""
    for name, field in model.model_fields.items():
        nested = _unwrap_model(field.annotation)
        if nested is None:
            continue
        for sep in (".", "_", "-"):
            head, _, tail = key.partition(sep)
            if head == name and tail in nested.model_fields:
                return f"{name}.{tail}"
    for name, field in model.model_fields.items():
        nested = _unwrap_model(field.annotation)
        if nested is not None and key in nested.model_fields:
            return f"{name}.{key}"
    return None


_TYPE_FIXES = {
    "string_type": "a quoted string",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping of keys to values",
    "model_type": "a mapping of keys to values",
    "model_attributes_type": "a mapping of keys to values",
}
_BOUNDS = {
    "greater_than_equal": (">=", "ge"),
    "greater_than": (">", "gt"),
    "less_than_equal": ("<=", "le"),
    "less_than": ("<", "lt"),
}


def hint_for(path: str, hints: Mapping[str, str]) -> str | None:
    """The most specific hint for a dotted path: 'env.FOO' falls back to 'env'."""
    key = re.sub(r"\[\d+\]", "", path)
    while True:
        if key in hints:
            return hints[key]
        if "." not in key:
            return None
        key = key.rsplit(".", 1)[0]


def explain_error(
    error: Mapping[str, Any],
    model: type[BaseModel],
    hints: Mapping[str, str],
    unknown_key_note: str = "",
    fix_for_unknown: Callable[[str, str | None], str] | None = None,
) -> str:
    """One pydantic error as "field 'x': what is wrong (got v). Fix: what to do."."""
    loc = tuple(error.get("loc", ()))
    kind = error.get("type", "")
    path = loc_path(loc)

    if kind == "extra_forbidden":
        key = str(loc[-1])
        parent = loc[:-1]
        parent_model = model_at(model, parent)
        allowed = sorted(parent_model.model_fields) if parent_model else []
        prefix = loc_path(parent) + "." if parent else ""
        guess = (_nested_home(parent_model, key) if parent_model else None) or closest(key, allowed)
        if guess and guess == key:  # 'vllm.version' given as one key: --data does this
            mean = f" (a key of the {guess.split('.')[0]!r} dict, not a key of its own)"
        else:
            mean = f" (did you mean {prefix + guess!r}?)" if guess else ""
        where = f" in {loc_path(parent)!r}" if parent else ""
        text = f"unknown key {prefix + key!r}{where}{mean}; allowed keys: {', '.join(allowed)}"
        if fix_for_unknown is not None:
            fix = fix_for_unknown(prefix + key, prefix + guess if guess else None)
        elif guess and "." in guess:
            fix = f"move it into {guess.split('.')[0]!r} as {guess!r}"
        elif guess:
            fix = f"rename {key!r} to {guess!r}"
        else:
            fix = f"remove {key!r}"
        return f"{text}{unknown_key_note}. Fix: {fix}."

    message = str(error.get("msg", "invalid value"))
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix) :]

    if kind == "missing":
        fix = hint_for(path, hints) or f"add {path!r}"
        return f"field {path!r} is missing. Fix: {_sentence(fix)}"

    got = ""
    if "input" in error:
        value = redacted(path, error["input"])
        shown = describe_value(value) if kind in _TYPE_FIXES else short_repr(value)
        if value is HIDDEN:
            shown = HIDDEN
        elif re.search(r"(^|\.)extra_args\[\d+\]$", path):
            # one item of an argument list: it may be the value of the --api-key before it, never shown
            shown = _ARTICLE_TYPES.get(type(value), f"a {type(value).__name__}")
        if short_repr(value) not in message:
            got = f" (got {shown})"
    if not path:
        # a rule over several fields of one mapping (a model validator)
        fix = hints.get("", "correct the values named above")
        return f"{message}{got}. Fix: {_sentence(fix)}"

    fix = hint_for(path, hints)
    if fix is None:
        if kind in _TYPE_FIXES:
            fix = f"write {path} as {_TYPE_FIXES[kind]}"
        elif kind in _BOUNDS:
            op, ctx_key = _BOUNDS[kind]
            fix = f"set {path} to a value {op} {error.get('ctx', {}).get(ctx_key)}"
        elif kind == "literal_error":
            fix = f"use one of {error.get('ctx', {}).get('expected')}"
        else:
            fix = f"correct {path}"
    elif kind in _TYPE_FIXES and kind != "int_from_float":
        fix = f"write {path} as {_TYPE_FIXES[kind]}; {fix}"
    return f"field {path!r}: {message}{got}. Fix: {_sentence(fix)}"


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "?", "!")) else text + "."
