"""docs/settings.md from the pydantic schema: every key a site may set, with its type, default and
description (models/schema.py ``Field(description=...)``, the one place each option is described).

    python -m models.settings_doc --markdown > docs/settings.md

tests/test_settings_doc.py fails when the file and the schema differ. The fixes that validation messages give
(``field_fix``, ``mapping_fix``) are read from the same descriptions, for a site's fields and a catalog entry's.
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel

from .schema import MultiNode, SiteSettings, SiteSource, VllmRuntime

# the models a site's data is made of, in the order the page shows them: (model, the key it sits under)
SECTIONS: tuple[tuple[type[BaseModel], str], ...] = (
    (SiteSettings, ""),
    (VllmRuntime, "vllm"),
    (SiteSource, "site_source"),
    (MultiNode, "multinode"),
)


def type_text(annotation: Any) -> str:
    """A field's type as a site file writes it: `int`, `"fast"` or `"full"`, list of `str`, ..."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return " or ".join(f'`"{arg}"`' if isinstance(arg, str) else f"`{arg!r}`" for arg in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_text(arg) for arg in args if arg is not type(None))
    if origin is list:
        return f"list of {type_text(args[0])}"
    if origin is dict:
        return f"dict of {type_text(args[0])} to {type_text(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"dict ([{annotation.__name__}](#{annotation.__name__.lower()}))"
    return f"`{getattr(annotation, '__name__', annotation)}`"


def default_text(field: Any) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        return f"`{field.default_factory()!r}`"
    if field.default is None:
        return "unset"
    return f'`"{field.default}"`' if isinstance(field.default, str) else f"`{field.default!r}`"


def bounds_text(field: Any) -> str:
    """The field's numeric bounds (Field ge/gt/le/lt): ``, 1 to 65535``, ``, at least 16``, ..."""
    low = high = None
    for bound in field.metadata:
        if getattr(bound, "ge", None) is not None:
            low = ("at least", bound.ge)
        if getattr(bound, "gt", None) is not None:
            low = ("above", bound.gt)
        if getattr(bound, "le", None) is not None:
            high = ("at most", bound.le)
        if getattr(bound, "lt", None) is not None:
            high = ("below", bound.lt)
    if low and high and low[0] == "at least" and high[0] == "at most":
        return f", {low[1]} to {high[1]}"
    return "".join(f", {words} {value}" for words, value in filter(None, (low, high)))


def field_fix(path: str, field: Any) -> str:
    """How to set one field, as the fix of a message about it: its description, choices, bounds and default
    (models/validate.py ``schema_hints``, models/catalog.py ``catalog_hints``: the schema is the one place)."""
    what = field.description or ""
    if typing.get_origin(field.annotation) is Literal:
        what = f"{type_text(field.annotation)} ({what})" if what else type_text(field.annotation)
    elif field.annotation is bool:
        what = f"True or False ({what})" if what else "True or False"
    elif not what:
        what = type_text(field.annotation)
    said = [bounds_text(field).removeprefix(", ")]
    if not field.is_required():
        said.append("or remove it" if field.default is None and field.default_factory is None
                    else f"default {default_text(field)}")
    said = ", ".join(part for part in said if part)
    return (f"set {path} to {what}" + (f": {said}" if said else "")).replace("`", "")


def mapping_fix(path: str, model: type[BaseModel], description: str | None = None) -> str:
    """How to give a field that is a mapping of its own (a nested model): its keys and what it is (the field's
    description, else the model's docstring)."""
    doc = " ".join((description or model.__doc__ or "").split()).rstrip(".")
    if doc[:2].istitle():  # "Where the weights ..." -> "where the weights ...", never "vLLM" -> "vlLM"
        doc = doc[0].lower() + doc[1:]
    return f"give {path} as a mapping of {', '.join(model.model_fields)}" + (f" ({doc})" if doc else "")


def cell(text: str) -> str:
    # a table cell: '|' would end it, '<root>' would read as an HTML tag
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def field_rows(model: type[BaseModel], under: str = "") -> list[str]:
    prefix = f"{under}." if under else ""
    return [
        f"| `{prefix}{name}` | {type_text(field.annotation)}{bounds_text(field)} | {default_text(field)} | "
        f"{cell(field.description or '')} |"
        for name, field in model.model_fields.items()
    ]


def settings_markdown() -> str:
    """docs/settings.md."""
    lines = [
        "# Settings",
        "",
        "Generated from `models/schema.py` by `python -m models.settings_doc --markdown`; a test fails when this",
        "file and the schema differ. Each description is the field's `Field(description=...)`: change it there.",
        "",
        "A host's data sets these: its inventory tuple, `group_data/<group>.py`, or `--data key=value` on the",
        "command line. Every key is validated before any host is touched: a typo or a bad value stops the run",
        "naming the file, the field and the fix. pyinfra's own keys (`ssh_*`, `_sudo`, ...) pass through.",
        "",
    ]
    for model, under in SECTIONS:
        doc = " ".join((model.__doc__ or "").split())
        where = f" Under `{under}`." if under else ""
        lines += [f"## {model.__name__}", "", f"{doc}{where}", "",
                  "| key | type | default | what it does |", "|---|---|---|---|", *field_rows(model, under), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="heavylift's site settings, from the schema")
    parser.add_argument("--markdown", action="store_true", help="print docs/settings.md")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(settings_markdown())
    else:
        for model, under in SECTIONS:
            for name, field in model.model_fields.items():
                print(f"{under + '.' if under else ''}{name}: {type_text(field.annotation)}, {default_text(field)}")


if __name__ == "__main__":
    main()
