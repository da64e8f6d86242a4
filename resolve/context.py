"""The run context: what this run of the pyinfra CLI was asked, read once per deploy file.

pyinfra 3.10 hands deploy code its ``state`` (``state.cwd`` after ``--chdir``, ``state.config.DIFF``)
and the inventory (``inventory.get_override_data()``: the ``--data`` values, parsed), but keeps no
record of ``--dry``, the inventory's path or ``--group-data`` (pyinfra_cli/cli.py ``_main`` holds them
as locals). Those three are read here from the command line with a parser of pyinfra's own option
table. ``pyinfra_cli`` itself is never imported: its ``__init__`` runs ``gevent.monkey.patch_all()``,
which in a process that is not the CLI (the tests) patches the standard library under everything else.

Nothing here is cached: deploy.py builds one context per host run and passes it down.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# pyinfra 3.10's options that take a value (pyinfra_cli/cli.py; tests/test_run_context.py checks this
# table against pyinfra's click command in a subprocess); every other option is a flag
VALUE_OPTIONS = frozenset({
    "--chdir", "--config", "--data", "--dzdo-user", "--exclude", "--fail-percent", "--group-data", "--key",
    "--key-password", "--limit", "--parallel", "--password", "--port", "--retry", "--retry-delay",
    "--shell-executable", "--ssh-key", "--ssh-key-password", "--ssh-password", "--ssh-port", "--ssh-user",
    "--su-user", "--sudo-user", "--user",
})

# how far a run goes: `prepare` converges runtime, weights and overlay and stages the release folder;
# `serve` (the default) also switches `current`, (re)starts the service and runs the readiness gate
UNTIL = ("prepare", "serve")
Until = Literal["prepare", "serve"]


@dataclass(frozen=True)
class CommandLine:
    """The parts of a pyinfra command line that pyinfra does not keep for deploy code."""

    inventory: str | None = None  # the first positional argument, as typed
    dry: bool = False
    group_data: tuple[str, ...] = ()
    chdir: str | None = None

    @classmethod
    def parse(cls, argv: Sequence[str]) -> CommandLine:
        positional: list[str] = []
        dry, group_data, chdir = False, [], None
        args = list(argv)
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                positional.extend(args[i + 1:])
                break
            if arg.startswith("--"):
                name, has_value, value = arg.partition("=")
                if name in VALUE_OPTIONS and not has_value:
                    i += 1
                    value = args[i] if i < len(args) else ""
                if name == "--dry":
                    dry = True
                elif name == "--group-data":
                    group_data.append(value)
                elif name == "--chdir":
                    chdir = value
            elif not (arg.startswith("-") and len(arg) > 1):
                positional.append(arg)
            i += 1
        return cls(inventory=positional[0] if positional else None, dry=dry, group_data=tuple(group_data), chdir=chdir)


@dataclass(frozen=True)
class RunContext:
    """Everything about this run that is not the site's data: read once, passed to every stage."""

    cwd: Path
    inventory: Path | None = None  # the inventory file (None: hosts given on the command line, or the API)
    group_data: tuple[Path, ...] = ()  # --group-data folders
    dry: bool = False
    diff: bool = False
    data: Mapping[str, Any] = field(default_factory=dict)  # --data, as pyinfra parsed it
    lock_file: Path = Path("heavylift.lock.json")
    until: Until = "serve"

    @classmethod
    def build(
        cls, cwd: str | os.PathLike, argv: Sequence[str] = (), diff: bool = False, data: Mapping[str, Any] | None = None,
        until: Until = "serve", environ: Mapping[str, str] | None = None,
    ) -> RunContext:
        environ = os.environ if environ is None else environ
        line = CommandLine.parse(argv)
        base = Path(cwd)
        inventory = None
        if line.inventory and line.inventory.endswith(".py"):
            candidate = Path(line.inventory)
            candidate = candidate if candidate.is_absolute() else base / candidate
            inventory = candidate.resolve() if candidate.is_file() else None
        group_data = tuple(Path(d) if Path(d).is_absolute() else base / d for d in line.group_data)
        return cls(
            cwd=base, inventory=inventory, group_data=group_data, dry=line.dry, diff=diff,
            data=dict(data or {}), lock_file=lock_file_for(inventory, base, environ), until=until,
        )

    @classmethod
    def of_pyinfra(cls, state, host=None, until: Until = "serve") -> RunContext:
        """The context of the running pyinfra CLI (deploy code: ``from pyinfra import host, state``)."""
        inventory = getattr(host, "inventory", None) or getattr(state, "inventory", None)
        data = inventory.get_override_data() if inventory is not None else {}
        return cls.build(
            getattr(state, "cwd", None) or os.getcwd(), sys.argv[1:], diff=bool(getattr(state.config, "DIFF", False)),
            data=data, until=until,
        )


def lock_file_for(inventory: Path | None, cwd: Path, environ: Mapping[str, str]) -> Path:
    """Beside the inventory (``site.py`` -> ``site.lock.json``); $HEAVYLIFT_LOCK_FILE overrides it."""
    override = environ.get("HEAVYLIFT_LOCK_FILE")
    if override:
        return Path(override)
    if inventory is None:
        return cwd / "heavylift.lock.json"
    return inventory.with_suffix(".lock.json")
