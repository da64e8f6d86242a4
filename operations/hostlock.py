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

Taken while deploy.py is prepared (before any operation runs), with a plain command, and given
back by an operation that shows no change, so a run that changes nothing still shows no change.
``--dry`` runs only look.
"""

from __future__ import annotations

import getpass
import os
import socket
import time

from pyinfra import host as current_host, state as current_state
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.api.state import BaseStateCallback

from models.errors import HeavyliftConfigError

from . import factbatch, hostpython

LOCKED = 75  # EX_TEMPFAIL

SCRIPT = hostpython.script("host_lock.py")


class HostLocked(HeavyliftConfigError):
    """Another run holds the host's lock."""


def control_label() -> str:
    return f"pyinfra run of {getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()})"


def lock_command(path: str, mode: str = "take", label: str | None = None) -> StringCommand:
    return StringCommand(hostpython.PYTHON, "-c", QuoteString(SCRIPT), QuoteString(path), QuoteString(label or control_label()), mode)


def take(host, path: str, dry: bool = False, state=None) -> str:
    """Take the host's lock (or, in a dry run, look at it). Raises HostLocked naming the holder."""
    started = time.monotonic()
    # the facts the run reads next come back in the same round trip, read after the lock is held
    command = lock_command(path, "check" if dry else "take")
    status, lines, stderr = factbatch.command_then_facts(current_state if state is None else state, host, command)
    said = " ".join(" ".join(lines).split()) or stderr.strip()
    if said.startswith("locked by"):
        if dry:
            return f"another run holds the lock: {said}"
        raise HostLocked(
            f"host '{host.name}': {said}. One run at a time per host: wait for it to finish; a lock whose run died "
            f"is recovered automatically by the next run. (checked in {time.monotonic() - started:.1f} s)"
        )
    if not status:
        raise HostLocked(f"host '{host.name}': could not take the deploy lock {path}: {said}")
    return said


class _ReleaseOnFailure(BaseStateCallback):
    """A host whose operation failed gives its lock back at once: its connection is still open, and the run stops there."""

    def __init__(self):
        self.paths: dict[str, str] = {}

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0):
        path = self.paths.pop(host.name, None)
        if path:
            host.run_shell_command(lock_command(path, "release"))


def hold(host, state, path: str, dry: bool = False) -> str:
    """Take the host's lock for this run (``take``) and give it back if one of the host's operations fails."""
    said = take(host, path, dry=dry, state=state)
    if not dry:
        handler = next((h for h in state.callback_handlers if isinstance(h, _ReleaseOnFailure)), None)
        if handler is None:
            handler = _ReleaseOnFailure()
            state.add_callback_handler(handler)
        handler.paths[host.name] = path
    return said


@operation()
def released(path: str):
    """
    Give back the host lock this run holds: the run's last operation.

    + path: the lock folder (``<root>/deploy.lock``)

    Its command runs while the run executes, never while it is prepared, and it shows no change:
    a run that changed nothing still says so. A lock held by another run is left alone.
    """
    if current_state.is_executing:
        status, output = current_host.run_shell_command(lock_command(path, "release"))
        said = " ".join(output.stdout.split()) or output.stderr.strip()
        if not status:
            raise HostLocked(f"host '{current_host.name}': could not release the deploy lock {path}: {said}")
        current_host.noop(f"deploy lock {said}")
    else:
        current_host.noop(f"the deploy lock {path} is given back at the end of the run")
    return
    yield  # an operation is a generator; this one runs its command itself, as facts do
