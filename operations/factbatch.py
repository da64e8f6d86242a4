"""Facts read in one round trip: the facts a host's last run read, prefetched together.

pyinfra 3.10 runs one command per fact read (api/facts.py ``_get_fact``: one
``host.run_shell_command`` each, no cache), and a converged heavylift host reads about fifty:
fifty SSH round trips, most of a no-op re-run's time. This module remembers, per host, which
facts (class and arguments) a run read, and on the next run reads them all at once, side by
side in one shell command, when the first of them is asked for. A fact then asked for with the
same command and connector arguments gets the prefetched answer; anything else is read as
pyinfra reads it.

What keeps an answer true: it only lives until the run changes the host. Any command, upload or
callback that runs on the host (``run_shell_command`` / ``put_file`` other than a fact read)
drops every prefetched answer; the next fact read starts a new segment and prefetches what the
last run read in that segment. So an answer is never older than the last change this run made; a
host that drifted answers differently and the operations see it, exactly as without the batch. A
wrong or stale record only costs a wasted read.

The step from pyinfra's prepare stage to its execute stage drops every answer too when the run
stops there to ask (no ``-y``): the operator may take minutes, and the host may change meanwhile.
A run that does not ask goes straight on, with nothing run on the host between the two stages, so
its answers carry over, and the execute stage's first segment is read together with the prepare
stage's last one (the last run's record says which that is). A command that must run before
the next segment's reads (a deploy lock taken as the run starts, ``command_then_facts``) carries
those reads in the same round trip, run after it. And ``before_first_change`` runs a step of the
run's own just before its first change to the host (the deploy lock's take,
operations/hostlock.py), so a converged re-run makes one round trip: every read, the look at the
lock among them.

The record holds fact classes and arguments (never commands), from pyinfra's and heavylift's own
fact modules only, under ``$HEAVYLIFT_CACHE/facts`` (default ``~/.cache/heavylift``).
``HEAVYLIFT_FACT_BATCH=0`` turns it off.
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import importlib
import json
import os
import secrets
from pathlib import Path

from pyinfra import logger
from pyinfra.api import FactBase, StringCommand
from pyinfra.api import facts as pyinfra_facts
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.exceptions import FactProcessError
from pyinfra.api.facts import ShortFactBase
from pyinfra.api.state import StateStage
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.context import ContextObject

# modules whose facts may be named in a record: pyinfra's own and heavylift's (operations/)
FACT_MODULES = ("pyinfra.facts.", "operations.")
MARK = "@@heavylift-fact"
_original_get_fact = pyinfra_facts._get_fact
_batches: dict[int, "FactBatch"] = {}


def cache_dir() -> Path:
    return Path(os.environ.get("HEAVYLIFT_CACHE", Path.home() / ".cache" / "heavylift")) / "facts"


def enabled() -> bool:
    return os.environ.get("HEAVYLIFT_FACT_BATCH", "1") != "0"


def host_key(host) -> str:
    """One record per host as the inventory reaches it (name, address, port, user)."""
    data = host.data
    parts = [host.name, *(str(data.get(k)) for k in ("ssh_hostname", "ssh_port", "ssh_user"))]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def fact_command(state, host, cls, args, kwargs, fact=None) -> tuple[str, str, dict, dict]:
    """(command text, connector key, connector arguments, fact kwargs) of one read, built as ``_get_fact``
    builds them (pyinfra 3.10 api/facts.py): the same command under the same connector arguments is the same read.
    ``fact``: the instance whose ``command`` is called (some keep what it was given for ``process``)."""
    fact = fact or cls()
    fact_kwargs, global_kwargs = pyinfra_facts._handle_fact_kwargs(state, host, cls, args, kwargs)
    if fact.shell_executable:
        global_kwargs["_shell_executable"] = fact.shell_executable
    command = pyinfra_facts._make_command(fact.command, dict(fact_kwargs))
    requires = pyinfra_facts._make_command(fact.requires_command, dict(fact_kwargs))
    if requires:
        # the guard _get_fact puts around it: a missing binary answers the marker
        command = StringCommand("if", "command", "-v", requires, ">/dev/null", "2>&1;", "then", "(", command, ");",
                                "else", "echo", f"'{pyinfra_facts._MISSING_COMMAND_MARKER}';", "fi")
    text = command.get_raw_value() if isinstance(command, StringCommand) else str(command)
    executor = {key: value for key, value in global_kwargs.items() if key in CONNECTOR_ARGUMENT_KEYS}
    connector = repr(sorted((key, repr(value)) for key, value in executor.items()))
    return text, connector, executor, {key: value for key, value in fact_kwargs.items() if key != "self"}


def begin_line(nonce: str) -> str:
    """The line a batch prints before the facts' outputs (what a command run first printed is above it)."""
    return f"{MARK} {nonce} begin"


def batch_script(commands: list[str], nonce: str) -> str:
    """One shell script running every command side by side, then printing a line ``MARK nonce begin`` and
    each one's stdout in turn, each closed by a line ``MARK nonce index status``. Each command's output
    file ends with its own closing line, so one ``cat`` prints them all (a process per fact is most of a
    small fact's cost)."""
    lines = ['d=$(mktemp -d) || exit 1']
    for index, command in enumerate(commands):
        lines.append(f'( ( {command}\n) >"$d/{index}" 2>/dev/null </dev/null; '
                     f'printf "\\n%s %s\\n" "{MARK} {nonce} {index}" "$?" >>"$d/{index}" ) &')
    lines.append("wait")
    lines.append(f'printf "%s\\n" "{begin_line(nonce)}"')
    lines.append("cat " + " ".join(f'"$d/{i}"' for i in range(len(commands))))
    lines.append('rm -rf "$d"')
    return "\n".join(lines)


def split_output(lines: list[str], nonce: str) -> dict[int, tuple[int, list[str]]]:
    """index -> (exit status, stdout lines as pyinfra would have read them) from a batch's output."""
    parts: dict[int, tuple[int, list[str]]] = {}
    prefix = f"{MARK} {nonce} "
    begin = next((i for i, line in enumerate(lines) if line == begin_line(nonce)), None)
    if begin is None:
        return parts
    current: list[str] = []
    for line in lines[begin + 1:]:
        if line.startswith(prefix):
            index, _, status = line[len(prefix):].partition(" ")
            # the newline printed before each closing line: one empty line too many when the output ended with its own
            if current and current[-1] == "":
                current.pop()
            parts[int(index)] = (int(status) if status.strip().isdigit() else 1, current)
            current = []
        else:
            current.append(line)
    return parts


class FactBatch:
    """One host's record (what the last run read, by segment) and this run's prefetched answers."""

    def __init__(self, host, path: Path):
        self.host = host
        self.path = path
        self.previous: dict[str, list] = {}
        try:
            self.previous = json.loads(path.read_text()).get("segments", {})
        except (OSError, ValueError, AttributeError):
            self.previous = {}
        self.recorded: dict[str, list] = {}
        self.answers: dict[tuple, object] = {}
        self.stage = None
        self.changes = 0
        self.prefetched: set[str] = set()
        self.ahead: set[str] = set()  # later segments marked prefetched with this one: void after a change
        self.carry = False  # the run does not stop between its stages (-y): answers carry over the step
        self.reading = False
        self.round_trips = 0
        self.served = 0
        # run once, just before the host's first change (the deploy lock's take): () -> (go on, message)
        self.before_change = None

    @property
    def segment(self) -> str:
        return f"{int(self.stage or 0)}.{self.changes}"

    def host_changed(self) -> None:
        """A command, upload or callback ran on the host: no prefetched answer holds any more."""
        self.answers.clear()
        self.prefetched -= self.ahead
        self.ahead = set()
        self.changes += 1

    def _enter_stage(self, state) -> None:
        stage = state.current_stage
        if stage != self.stage:
            # without -y pyinfra asks the operator between the stages; with it nothing runs in between
            self.carry = not state.should_check_for_changes()
            if not (self.carry and self.stage is not None):
                self.answers.clear()
            self.stage, self.changes = stage, 0

    def _lookahead(self) -> list[str]:
        """Segments read together with this one: in a run that does not ask, the execute stage's first segment
        when this is the prepare stage's last in the last run's record (nothing runs on the host between them)."""
        if not self.carry or self.stage != StateStage.Prepare:
            return []
        prepare = [key for key in self.previous if key.startswith(f"{int(StateStage.Prepare)}.")]
        last = max((int(key.split(".")[1]) for key in prepare), default=None)
        following = f"{int(StateStage.Execute)}.0"
        return [following] if last == self.changes and self.previous.get(following) else []

    def record(self, cls, fact_kwargs: dict) -> None:
        try:
            entry = [cls.__module__, cls.__name__, json.loads(json.dumps(fact_kwargs))]
        except (TypeError, ValueError):
            return
        entries = self.recorded.setdefault(self.segment, [])
        if entry not in entries:
            entries.append(entry)

    def prefetch(self, state) -> None:
        """Read every fact the last run read in this segment (and the segments read with it), in one command per
        set of connector arguments."""
        for connector, (executor, wanted) in self._wanted(state).items():
            self._read_together(connector, executor, wanted)

    def _wanted(self, state) -> dict[str, tuple[dict, list]]:
        """The reads of this segment and its lookahead, by connector arguments; marks them prefetched."""
        ahead = self._lookahead()
        self.prefetched.add(self.segment)
        self.prefetched.update(ahead)
        self.ahead |= set(ahead)
        entries = [entry for segment in [self.segment, *ahead] for entry in self.previous.get(segment, [])]
        groups: dict[str, tuple[dict, list]] = {}
        seen: set[tuple[str, str]] = set()
        for module, name, kwargs in entries:
            if not module.startswith(FACT_MODULES) or not isinstance(kwargs, dict):
                continue
            try:
                cls = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError):
                continue
            if not (isinstance(cls, type) and issubclass(cls, FactBase)) or issubclass(cls, ShortFactBase):
                continue
            if cls().check_preconditions(state, self.host):
                continue
            fact = cls()
            try:
                text, connector, executor, _ = fact_command(state, self.host, cls, None, kwargs, fact)
            except Exception:  # noqa: BLE001 (a record from another version of a fact: read it live)
                continue
            if (text, connector) in seen:
                continue
            seen.add((text, connector))
            groups.setdefault(connector, (executor, []))[1].append((fact, text))
        return groups

    def _read_together(self, connector: str, executor: dict, wanted: list, first: str | None = None):
        """One round trip: ``first`` (a command of the run's own, e.g. the deploy lock), then, when it succeeded,
        the facts side by side. Returns (status, the lines ``first`` printed, its stderr) when ``first`` is given."""
        nonce = secrets.token_hex(8)
        script = batch_script([text for _, text in wanted], nonce) if wanted else "true"
        if first is not None:
            script = f"{first}\nrc=$?\nif [ $rc -eq 0 ]; then\n{script}\nfi\nexit $rc"
        self.reading = True
        try:
            # run as each fact alone would run: the same connector arguments (sudo, shell, env)
            status, output = self.host.run_shell_command(StringCommand(script), **executor)
        except Exception as error:  # noqa: BLE001 (the facts are then read one by one, as pyinfra does)
            if first is not None:
                raise
            logger.debug(f"fact batch on {self.host.name} failed: {error}")
            return None
        finally:
            self.reading = False
        self.round_trips += 1
        said = None
        if first is not None:
            lines = output.stdout_lines
            ends = next((i for i, line in enumerate(lines) if line == begin_line(nonce)), len(lines))
            said = (status, lines[:ends], output.stderr)
        if not status:
            return said
        for index, (rc, lines) in split_output(output.stdout_lines, nonce).items():
            fact, text = wanted[index]
            cls = type(fact)
            if rc != 0 or lines == [pyinfra_facts._MISSING_COMMAND_MARKER]:
                continue  # read live: pyinfra's own handling of errors and missing commands applies
            try:
                value = fact.process(lines) if lines else fact.default()
            except (FactProcessError, Exception):  # noqa: BLE001 (read live, where pyinfra reports it)
                continue
            self.answers[(cls.__module__, cls.__name__, text, connector)] = value
        return said

    def command_then_facts(self, state, command: StringCommand, executor: dict):
        """Run ``command`` (a change: a new segment begins) and, in the same round trip after it, the facts the
        last run read next. Returns (status, stdout lines, stderr) of ``command`` alone."""
        self._enter_stage(state)
        self.host_changed()
        groups = self._wanted(state)
        connector = repr(sorted((key, repr(value)) for key, value in executor.items()))
        # the reads under the command's own connector arguments go with it; others (sudo, ...) after it
        wanted = groups.pop(connector)[1] if connector in groups else []
        status, lines, stderr = self._read_together(connector, executor, wanted, first=command.get_raw_value())
        if status:
            for other, (other_executor, other_wanted) in groups.items():
                self._read_together(other, other_executor, other_wanted)
        return status, lines, stderr

    def get(self, state, cls, args, kwargs, ensure_hosts, apply_failed_hosts):
        self._enter_stage(state)
        try:
            text, connector, _, fact_kwargs = fact_command(state, self.host, cls, args, kwargs)
        except Exception:  # noqa: BLE001 (pyinfra's own read says what is wrong)
            return self._live(state, cls, args, kwargs, ensure_hosts, apply_failed_hosts)
        self.record(cls, fact_kwargs)
        if self.segment not in self.prefetched and self.previous.get(self.segment):
            self.prefetch(state)
        key = (cls.__module__, cls.__name__, text, connector)
        if key in self.answers:
            self.served += 1
            return copy.deepcopy(self.answers[key])
        return self._live(state, cls, args, kwargs, ensure_hosts, apply_failed_hosts)

    def _live(self, state, cls, args, kwargs, ensure_hosts, apply_failed_hosts):
        self.reading = True
        try:
            return _original_get_fact(state, self.host, cls, args, kwargs, ensure_hosts, apply_failed_hosts)
        finally:
            self.reading = False

    def save(self) -> None:
        if not self.recorded:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps({"host": self.host.name, "segments": self.recorded}, indent=1) + "\n")
        partial.replace(self.path)


def command_then_facts(state, host, command: StringCommand):
    """Run a command of the run's own on the host (a change), with the next segment's fact reads in the same
    round trip after it when the batch is on. Returns (status, stdout lines, stderr) of the command alone."""
    if isinstance(host, ContextObject):
        host = host._get_module()
    batch = _batches.get(id(host))
    if batch is None or batch.host is not host or batch.reading:
        status, output = host.run_shell_command(command)
        return status, output.stdout_lines, output.stderr
    # the arguments a fact read gets (the host's defaults): the command runs under the same
    _, _, executor, _ = fact_command(state, host, _Probe, None, {})
    return batch.command_then_facts(state, command, executor)


class _Probe(FactBase):
    """No fact is read with it: it gives the connector arguments a plain read runs under."""

    def command(self):
        return "true"


def _batched_get_fact(state, host, cls, args=None, kwargs=None, ensure_hosts=None, apply_failed_hosts=True):
    batch = _batches.get(id(host))
    if batch is None or batch.host is not host or batch.reading:
        return _original_get_fact(state, host, cls, args, kwargs, ensure_hosts, apply_failed_hosts)
    return batch.get(state, cls, args, kwargs, ensure_hosts, apply_failed_hosts)


def _watch(host, batch: FactBatch, method: str) -> None:
    """Every ``method`` call on the host that is not a fact read is a change; the first one runs
    ``before_change`` first, and does not run when it says no (the command fails with its message)."""
    original = getattr(host, method)

    def watched(*args, **kwargs):
        if not batch.reading:
            hook, batch.before_change = batch.before_change, None
            if hook is not None:
                go_on, said = hook()
                if not go_on:
                    logger.error(f"{host.print_prefix}{said}")
                    if method == "put_file":
                        return False
                    return False, CommandOutput([OutputLine("stderr", said)])
            batch.host_changed()
        return original(*args, **kwargs)

    setattr(host, method, watched)


def before_first_change(host, hook) -> bool:
    """Run ``hook`` (-> (go on, message)) once, just before the first command or upload of this run that
    is not a fact read; that change is not made when it says no. False when the batch is off (nothing
    watches the host's commands then: the caller acts at once)."""
    if isinstance(host, ContextObject):
        host = host._get_module()
    batch = _batches.get(id(host))
    if batch is None or batch.host is not host:
        return False
    batch.before_change = hook
    return True


def _save_all() -> None:
    for batch in list(_batches.values()):
        try:
            batch.save()
        except OSError as error:  # a read-only home: the next run reads facts one by one
            logger.debug(f"fact record for {batch.host.name} not saved: {error}")


def activate(host) -> FactBatch | None:
    """Batch this host's fact reads for the rest of the run (once per host; deploy.py calls it first)."""
    if not enabled():
        return None
    if isinstance(host, ContextObject):  # deploy code's `host` is pyinfra's proxy of the current one
        host = host._get_module()
    batch = _batches.get(id(host))
    if batch is not None and batch.host is host:
        return batch
    batch = FactBatch(host, cache_dir() / f"{host_key(host)}.json")
    _batches[id(host)] = batch
    for method in ("run_shell_command", "put_file"):
        _watch(host, batch, method)
    if pyinfra_facts._get_fact is not _batched_get_fact:
        pyinfra_facts._get_fact = _batched_get_fact
        atexit.register(_save_all)
    return batch
