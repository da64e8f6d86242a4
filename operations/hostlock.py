"""One run at a time per host: a lock folder whose holder is the run's own connection to the host.

``mkdir`` is atomic, so of two runs exactly one creates ``<root>/deploy.lock``. The lock
records its holder: the process on the host that carries the run's connection (the sshd
session of pyinfra's SSH connection, which lives exactly as long as the run; pyinfra itself
for ``@local``), with its start time, so a reused pid is not mistaken for it, plus the
control machine's user, host name and pid for the message. A second run fails fast naming
the holder. The run gives the lock back as its last operation (``released``), and a host whose
run fails gives it back as soon as the failing operation ends (``hold``'s callback), so the next
run finds it free. A lock whose holder is gone (a run killed, a connection dropped, a power cut
of the control machine) is stale: the next run renames it aside (atomic: one winner), says
"recovered a stale lock of ..." and takes a fresh one. Only the holder's own connection
releases a lock; a release by anyone else changes nothing.

A run looks at the lock while deploy.py is prepared, with its other reads, and takes it just
before its first change to the host (a run that changes nothing, the converged re-run operators
run most, never takes it: no round trip to take it, none to give it back). What it read stays
true because every take counts a generation (``<root>/deploy.lock.generation``): the take names
the generation the run read, and fails when another run took the lock since ("another run changed
the host after this run read it"; run again). A stale lock is recovered at once, as the run
starts. Without the fact batch (``HEAVYLIFT_FACT_BATCH=0``) the lock is taken as the run starts.
``--dry`` runs only look.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time

from paramiko import SSHException
from pyinfra import host as current_host, logger, state as current_state
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ContextObject

from models.errors import HeavyliftConfigError

from . import factbatch, hostpython
from .runstate import handler_of

LOCKED = 75  # EX_TEMPFAIL

SCRIPT = hostpython.script("host_lock.py")


class HostLocked(HeavyliftConfigError):
    """Another run holds the host's lock."""


def control_label() -> str:
    return f"pyinfra run of {getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()})"


def lock_command(path: str, mode: str = "take", label: str | None = None, generation: int | None = None) -> StringCommand:
    extra = [str(generation)] if generation is not None else []
    return StringCommand(hostpython.PYTHON, "-c", QuoteString(SCRIPT), QuoteString(path), QuoteString(label or control_label()),
                         mode, *extra)


def _locked(host, said: str, after: str = "") -> HostLocked:
    return HostLocked(
        f"host '{host.name}': {said}. One run at a time per host: wait for it to finish; a lock whose run died "
        f"is recovered automatically by the next run.{after}"
    )


def take(host, path: str, state=None, generation: int | None = None) -> str:
    """Take the host's lock now. Raises HostLocked naming the holder.
    ``generation``: the one the run read; the take fails when another run took the lock since."""
    started = time.monotonic()
    # the facts the run reads next come back in the same round trip, read after the lock is held
    command = lock_command(path, "take", generation=generation)
    status, lines, stderr = factbatch.command_then_facts(current_state if state is None else state, host, command)
    said = " ".join(" ".join(lines).split()) or stderr.strip()
    if said.startswith("locked by"):
        raise _locked(host, said, f" (checked in {time.monotonic() - started:.1f} s)")
    if not status:
        raise HostLocked(f"host '{host.name}': could not take the deploy lock {path}: {said}")
    return said


class DeployLock(FactBase):
    """The deploy lock as a run that has not taken it sees it: ``{"state": "free" | "held" | "stale",
    "holder": who (or None), "generation": how many takes so far}``."""

    def command(self, path):
        return lock_command(path, "look", label="-")

    def process(self, output):
        return json.loads(output[-1])


class _ReleaseOnFailure(BaseStateCallback):
    """The locks this run holds, by host name: a host whose operation failed gives its lock back at once
    (its connection is still open, and the run stops there); the others at their last operation."""

    def __init__(self):
        self.paths: dict[str, str] = {}

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0):
        path = self.paths.pop(host.name, None)
        if not path:
            return
        try:
            host.run_shell_command(lock_command(path, "release"))
        except (OSError, SSHException, EOFError) as error:
            # The failure was the connection itself (an sshd gone, a host cut off): raised from a pyinfra
            # callback, this would end the whole run at once, every other host's lock held and no wave summary.
            # The lock's holder is gone with the connection, so the next run recovers it as stale.
            logger.warning(f"{host.print_prefix}deploy lock not given back ({type(error).__name__}: {error}): "
                           "the connection is gone; the next run recovers the lock as stale")


def _held(state) -> dict[str, str]:
    """host name -> lock path of the locks this run holds (taken as it started or before its first change)."""
    return handler_of(state, _ReleaseOnFailure).paths


def hold(host, state, path: str, dry: bool = False) -> str:
    """This run's hold on the host's lock: a look now, with the run's other reads; the take just before the
    run's first change to the host (``factbatch.before_first_change``), naming the generation seen now.
    Raises HostLocked naming the holder when another run holds it. A stale lock is recovered (and taken) now,
    with a warning; so is every lock when the fact batch is off. A dry run only looks (and warns when
    another run holds the lock)."""
    if isinstance(host, ContextObject):
        host = host._get_module()
    lock = host.get_fact(DeployLock, path=path)
    if lock["state"] == "held":
        said = f"locked by {lock['holder']}: {path}"
        if not dry:
            raise _locked(host, said)
        said = f"another run holds the lock: {said}"
    elif dry:
        said = "free" if lock["state"] == "free" else f"stale lock of {lock['holder']}"
    elif lock["state"] == "free" and factbatch.before_first_change(host, lambda: _take_at_first_change(
            host, state, path, lock["generation"])):
        said = "free: taken at this run's first change"
    else:
        said = take(host, path, state=state, generation=lock["generation"])
        _held(state)[host.name] = path
    if said.startswith(("recovered", "another run")):
        logger.warning(f"{host.print_prefix}{said}")
    return said


def _take_at_first_change(host, state, path: str, generation: int) -> tuple[bool, str]:
    """The take before the run's first change: (taken, what the lock said)."""
    status, output = host.run_shell_command(lock_command(path, "take", generation=generation))
    said = " ".join(output.stdout.split()) or output.stderr.strip()
    if not status:
        return False, f"host '{host.name}': the deploy lock {path} was not taken, so nothing was changed: {said}"
    _held(state)[host.name] = path
    return True, said


def with_lock(host, state, path: str, dry: bool, steps):
    """``steps()`` under the host's lock, for every entry point that changes a host (deploy.py, rollback.py,
    retire.py): ``hold`` before its first operation (taken just before the run's first change, none for a run
    that changes nothing; a dry run only looks), ``released`` after its last, as the run's last operation (a
    host whose operation failed gives it back at once). Returns what ``steps`` returns.

    A call, not a ``with`` block: pyinfra breaks ties between operations ready together by the line numbers of
    the calls that added them (operations/oporder.py), and a ``with`` block's exit counts as the block's first
    line, so a lock given back there would sort before the block's operations. Here every step's operation is
    added from the line above ``released``'s (tests/test_entry_points.py)."""
    hold(host, state, path, dry=dry)
    done = steps()
    released(name="deploy lock given back", path=path)
    return done


@operation()
def released(path: str):
    """
    Give back the host lock this run holds: the run's last operation.

    + path: the lock folder (``<root>/deploy.lock``)

    Its command runs while the run executes, never while it is prepared, and it shows no change:
    a run that changed nothing still says so. A lock held by another run is left alone.
    """
    if current_state.is_executing:
        if _held(current_state).pop(current_host.name, None) is None:
            current_host.noop("no deploy lock to give back: this run changed nothing, so it never took it")
            return
        status, output = current_host.run_shell_command(lock_command(path, "release"))
        said = " ".join(output.stdout.split()) or output.stderr.strip()
        if not status:
            raise HostLocked(f"host '{current_host.name}': could not release the deploy lock {path}: {said}")
        current_host.noop(f"deploy lock {said}")
    else:
        current_host.noop(f"the deploy lock {path} is given back at the end of the run")
    return
    yield  # an operation is a generator; this one runs its command itself, as facts do
