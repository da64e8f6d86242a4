"""Fixture-driven tests for heavylift's pyinfra operations and facts, in the style of pyinfra's own.

Why not `pyinfra-testing` (0.2.1): it runs against pyinfra 3.10, but not against these
operations (checked with its own fixtures):
- a fact looked up without arguments (``host.get_fact(Arch)`` in ``runtime.uv``) comes back
  as its unhashable ``FakeFact`` wrapper, so ``UV_WHEEL_PLATFORMS.get(arch)`` raises TypeError;
- operation arguments are rebuilt only as enums/dataclasses: ``Snapshot.files`` (a
  ``tuple[HubFile, ...]``) stays a list of dicts and ``OperationMeta`` dependencies stay dicts,
  so ``weights.downloaded`` and both service operations cannot run;
- its fact tests call ``process()`` on empty output, where pyinfra 3.10 returns
  ``default()`` (``pyinfra/api/facts.py: _get_fact``), so "empty output -> default" cannot be
  asserted the way pyinfra behaves;
- it has no way to point ``runtime.LOCAL_CACHE`` at a prepared folder (no network for uv).

This module keeps its case format (``kwargs``, ``facts`` keyed ``"<module>.<Fact>"`` then by
pyinfra's ``get_kwargs_str``, ``commands``, noop message, ``exception``) and its approach (a fake
state and host put in pyinfra's context, the operation's ``_inner`` generator run directly),
and adds what these operations need. Case files:

    tests/operations/<module>.<operation>/<case>.json
        description  what the case shows (free text)
        kwargs       the operation's arguments; rebuilt from the annotations: dataclasses
                     (tuple/list/dict fields too), OperationMeta from
                     {"hash", "is_change"} (planning) or {"hash", "executed": {"success",
                     "commands"}} (execution), StringCommand from a string
        facts        {"<module>.<Fact>": value} for a fact without arguments, else
                     {"<module>.<Fact>": {"<get_kwargs_str>": value}}; every fact given must be
                     asked for and every fact asked for must be given
        executing    state.is_executing (default false: the planning pass)
        local_files  {relative path: text} written under a temporary folder "{tmp}" (kwargs may name it)
        patch        {"module.attribute": value}; "path:..." makes a Path; "{tmp}" is replaced
        commands     the exact commands, in order: a string per shell command (raw value),
                     ["upload", content or local path, dest], [function name, args, kwargs]
        noop         the host.noop message expected (or "noops": the list of them; none if absent)
        exception    {"name": ..., "message": ...} when the operation must raise

    tests/facts/<module>.<Fact>/<case>.json
        kwargs       the fact's arguments
        command      the exact command (raw value)
        output       the stdout lines the host prints (a string is split into lines)
        status       whether the command succeeded (default true)
        fact         the value pyinfra hands to the operation
"""

from __future__ import annotations

import os
import subprocess

import copy
import dataclasses
import inspect
import json
import re
import types
import typing
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import Config, FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.api.arguments import all_argument_meta
from pyinfra.api.facts import FactBase
from pyinfra.api.operation import OperationMeta
from pyinfra.api.util import get_kwargs_str
from pyinfra.connectors.ssh import SSHConnector
from pyinfra.connectors.util import CommandOutput
from pyinfra.context import ctx_host, ctx_state

TESTS_DIR = Path(__file__).resolve().parent
BASE_PACKAGE = "operations"


# --- case discovery ---------------------------------------------------------------------------

def case_params(kind: str) -> list:
    """pytest params (target, name, data) for every tests/<kind>/<module>.<attr>/<case>.json."""
    params = []
    for folder in sorted(p for p in (TESTS_DIR / kind).iterdir() if p.is_dir()):
        for case in sorted(folder.glob("*.json")):
            data = json.loads(case.read_text(encoding="utf-8"))
            params.append(pytest.param(folder.name, case.stem, data, id=f"{folder.name}/{case.stem}"))
    return params


def resolve(target: str):
    module_name, attr = target.rsplit(".", 1)
    return getattr(import_module(f"{BASE_PACKAGE}.{module_name}"), attr)


def fact_key(fact_cls: type) -> str:
    return f"{fact_cls.__module__.split('.')[-1]}.{fact_cls.__name__}"


# --- fake pyinfra state and host --------------------------------------------------------------

class FakeState:
    """What operations read from pyinfra's state while their command generator runs."""

    cwd = None  # files.put(add_deploy_dir=True) joins src to it; our sources are absolute
    in_op = True
    in_deploy = True
    pipelining = False

    def __init__(self, is_executing: bool = False):
        self.is_executing = is_executing
        self.config = Config()


class FakeHost:
    """A host whose facts come from a case file; records host.noop calls and the facts asked for."""

    name = "testhost"
    connector_cls = SSHConnector  # a host reached over SSH (an operation may treat @local otherwise)
    print_prefix = ""
    current_op_global_arguments = None
    in_op = True

    def __init__(self, facts: dict):
        self.facts = facts
        self.data: dict = {}
        self.noops: list[str] = []
        self.facts_asked: set[str] = set()

    def noop(self, description: str) -> None:
        self.noops.append(description)

    def log(self, *args, **kwargs) -> None:
        pass

    def get_temp_filename(self, *args, **kwargs) -> str:
        return "_tempfile_"

    def get_fact(self, fact_cls: type[FactBase], *args, **kwargs):
        key = fact_key(fact_cls)
        if key not in self.facts:
            raise KeyError(f"the case gives no fact {key}")
        self.facts_asked.add(key)
        # as pyinfra.api.facts._handle_fact_kwargs: global arguments (_sudo, ...) are not fact arguments
        kwargs = {k: v for k, v in kwargs.items() if k not in all_argument_meta}
        if not args and not kwargs:
            return copy.deepcopy(self.facts[key])
        call_args = inspect.getcallargs(fact_cls().command, *args, **kwargs)
        call_args.pop("self", None)
        kwargs_str = get_kwargs_str(call_args)
        if kwargs_str not in self.facts[key]:
            raise KeyError(f"the case gives no fact {key} for {kwargs_str!r} (it has: {list(self.facts[key])})")
        return copy.deepcopy(self.facts[key][kwargs_str])


# --- arguments from JSON ----------------------------------------------------------------------

def operation_meta(value: dict) -> OperationMeta:
    """An earlier operation: its planned change (is_change) or, while executing, its result."""
    executed = value.get("executed")
    meta = OperationMeta(value.get("hash", "dependency"), None if executed else value["is_change"])
    if executed:
        meta.set_complete(executed["success"], ["command"] * executed["commands"], CommandOutput([]))
    return meta


def coerce(value: Any, annotation: Any) -> Any:
    if value is None or annotation is None or annotation is Any:
        return value
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [m for m in typing.get_args(annotation) if m is not type(None)]
        for member in members:
            if isinstance(member, type) and typing.get_origin(member) is None and isinstance(value, member) \
                    and not dataclasses.is_dataclass(member):
                return value
        return coerce(value, members[0])
    if annotation is OperationMeta and isinstance(value, dict):
        return operation_meta(value)
    if annotation is StringCommand and isinstance(value, str):
        return StringCommand(value)
    if dataclasses.is_dataclass(annotation) and isinstance(value, dict):
        hints = typing.get_type_hints(annotation)
        return annotation(**{k: coerce(v, hints.get(k)) for k, v in value.items()})
    args = typing.get_args(annotation)
    if origin is tuple and isinstance(value, list):
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(coerce(v, args[0]) for v in value)
        return tuple(coerce(v, a) for v, a in zip(value, args))
    if origin is list and isinstance(value, list):
        return [coerce(v, args[0] if args else None) for v in value]
    if origin is dict and isinstance(value, dict):
        return {k: coerce(v, args[1] if len(args) == 2 else None) for k, v in value.items()}
    return value


def operation_kwargs(op, kwargs: dict) -> dict:
    hints = typing.get_type_hints(op._inner)
    unknown = set(kwargs) - set(inspect.signature(op._inner).parameters)
    assert not unknown, f"the case passes arguments the operation does not take: {sorted(unknown)}"
    return {k: coerce(v, hints.get(k)) for k, v in kwargs.items()}


# --- commands to JSON -------------------------------------------------------------------------

def plain(value: Any) -> Any:
    if isinstance(value, StringCommand):
        return value.get_raw_value()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def command_json(command: Any) -> Any:
    if isinstance(command, str):  # as pyinfra.api.operation does with a yielded string
        command = StringCommand(command.strip())
    if isinstance(command, StringCommand):
        raw, masked = command.get_raw_value(), command.get_masked_value()
        return raw if raw == masked else {"raw": raw, "masked": masked}
    if isinstance(command, FunctionCommand):
        return [command.function.__name__, plain(list(command.args)), plain(command.kwargs)]
    if isinstance(command, FileUploadCommand):
        if hasattr(command.src, "read"):
            command.src.seek(0)
            data = command.src.read()
            source = data.decode() if isinstance(data, bytes) else data
        else:
            source = str(command.src)
        return ["upload", source, str(command.dest)]
    raise AssertionError(f"unexpected command type {type(command).__name__}: {command!r}")


def fill_tmp(value: Any, tmp: str) -> Any:
    """"{tmp}" in case arguments -> the case's temporary folder (local files an operation uploads)."""
    if isinstance(value, str):
        return value.replace("{tmp}", tmp)
    if isinstance(value, list):
        return [fill_tmp(v, tmp) for v in value]
    if isinstance(value, dict):
        return {k: fill_tmp(v, tmp) for k, v in value.items()}
    return value


def replace_tmp(value: Any, tmp: str) -> Any:
    if isinstance(value, str):
        return value.replace(tmp, "{tmp}")
    if isinstance(value, list):
        return [replace_tmp(v, tmp) for v in value]
    if isinstance(value, dict):
        return {k: replace_tmp(v, tmp) for k, v in value.items()}
    return value


# --- running cases ----------------------------------------------------------------------------

def apply_patches(monkeypatch, patches: dict, tmp: Path) -> None:
    for dotted, value in patches.items():
        module_name, attr = dotted.rsplit(".", 1)
        if isinstance(value, str):
            value = value.replace("{tmp}", str(tmp))
            if value.startswith("path:"):
                value = Path(value[len("path:"):])
        monkeypatch.setattr(import_module(module_name), attr, value)


def run_operation(op, kwargs: dict, facts: dict, executing: bool = False) -> tuple[list, FakeHost]:
    """The operation's commands (as in case files) for JSON arguments and facts, and the host."""
    state = FakeState(is_executing=executing)
    host = FakeHost(copy.deepcopy(facts))
    with ctx_state.use(state), ctx_host.use(host):
        commands = [command_json(c) for c in op._inner(**operation_kwargs(op, kwargs))]
    return commands, host


def run_operation_case(target: str, data: dict, tmp_path: Path, monkeypatch) -> None:
    op = resolve(target)
    assert hasattr(op, "_inner"), f"{target} is not a pyinfra operation"

    for name, text in data.get("local_files", {}).items():
        local = tmp_path / name
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(text)
    apply_patches(monkeypatch, data.get("patch", {}), tmp_path)

    def no_network(*args, **kwargs):
        raise AssertionError(f"an operation test reached for the network: {args[:1]}")

    monkeypatch.setattr("urllib.request.urlopen", no_network)

    expected_error = data.get("exception")
    if expected_error:
        with pytest.raises(Exception) as raised:
            run_operation(op, data.get("kwargs", {}), data.get("facts", {}), data.get("executing", False))
        assert type(raised.value).__name__ == expected_error["name"]
        assert str(raised.value) == expected_error["message"]
        return
    commands, host = run_operation(op, fill_tmp(data.get("kwargs", {}), str(tmp_path)), data.get("facts", {}), data.get("executing", False))

    assert replace_tmp(commands, str(tmp_path)) == with_host_scripts(data["commands"])
    expected_noops = [data["noop"]] if "noop" in data else data.get("noops", [])
    assert host.noops == expected_noops
    if not commands:
        assert host.noops, "an operation that changes nothing must say why (host.noop)"
    assert host.facts_asked == set(host.facts), (
        f"facts given but never asked for: {sorted(set(host.facts) - host.facts_asked)}"
    )


def with_host_scripts(expected: Any) -> Any:
    """A case's command with each ``@script:NAME@`` replaced by operations/scripts/NAME, quoted as it is sent.

    The cases keep the script's name, not its body: a change to a host script changes what it does, which
    its own tests check, not every case that sends it."""
    import shlex

    from operations import hostpython

    def expand(text):
        return re.sub(r"@script:([\w.]+)@", lambda found: shlex.quote(hostpython.script(found.group(1))), text)

    if isinstance(expected, str):
        return expand(expected)
    if isinstance(expected, dict):
        return {key: with_host_scripts(value) for key, value in expected.items()}
    if isinstance(expected, list):
        return [with_host_scripts(value) for value in expected]
    return expected


def run_fact_case(target: str, data: dict) -> None:
    from pyinfra.api.facts import _make_command

    fact_cls = resolve(target)
    assert isinstance(fact_cls, type) and issubclass(fact_cls, FactBase), f"{target} is not a fact"
    fact = fact_cls()
    kwargs = data.get("kwargs", {})

    command = _make_command(fact.command, kwargs)
    assert command_json(command) == with_host_scripts(data["command"])
    assert _make_command(fact.requires_command, kwargs) == data.get("requires_command")

    output = data["output"]
    lines = output.splitlines() if isinstance(output, str) else output
    # as pyinfra.api.facts._get_fact: the default unless the command succeeded and printed something
    value = fact.default()
    if data.get("status", True) and lines:
        value = fact.process(lines)
    assert value == data["fact"]
    # what pyinfra hands to operations must survive JSON (the case file's own form) unchanged
    assert json.loads(json.dumps(value)) == value




# --- live checks on this machine --------------------------------------------------------------

def local_pyinfra_host():
    """pyinfra's own @local host, connected: facts gathered through pyinfra's real code path."""
    from pyinfra.api import Inventory, State
    from pyinfra.api.connect import connect_all

    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    connect_all(state)
    return inventory.get_host("@local")


def sh(command: str) -> str:
    """``command`` run by this machine's sh with only PATH set: what a host's shell does with a command."""
    return subprocess.run(["sh", "-c", command], check=True, capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"]}).stdout
