"""One run at a time per host: a lock folder whose holder is the run's own connection to the host.

``mkdir`` is atomic, so of two runs exactly one creates ``<root>/deploy.lock``. The lock
records its holder: the process on the host that carries the run's connection (the sshd
session of pyinfra's SSH connection, which lives exactly as long as the run; pyinfra itself
for ``@local``), with its start time, so a reused pid is not mistaken for it, plus the
control machine's user, host name and pid for the message. A second run fails fast naming
the holder. A lock whose holder is gone (a run killed, a connection dropped) is stale: the
next run renames it aside (atomic: one winner) and takes a fresh one. Nothing has to release
the lock: it goes stale when the run's connection closes, and the next run removes it.

Taken while deploy.py is prepared (before any operation runs), with a plain command, so a
run that changes nothing still shows no change. ``--dry`` runs only look.
"""

from __future__ import annotations

import getpass
import os
import socket
import time

from pyinfra.api import QuoteString, StringCommand

from models.errors import HeavyliftConfigError

LOCKED = 75  # EX_TEMPFAIL

SCRIPT = r"""
import json, os, sys, time
path, label, mode = sys.argv[1], sys.argv[2], sys.argv[3]
# shells and privilege tools between the connection and this script
SKIP = {"sh", "bash", "dash", "sudo", "su", "doas", "timeout", "setsid"}

def stat(pid):
    with open(f"/proc/{pid}/stat") as handle:
        text = handle.read()
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return comm, int(fields[1]), fields[19]  # comm, ppid, starttime

def holder():
    pid = os.getppid()
    while pid > 1:
        comm, ppid, start = stat(pid)
        if comm not in SKIP:
            return {"pid": pid, "comm": comm, "start": start}
        pid = ppid
    return {"pid": os.getppid(), "comm": "?", "start": stat(os.getppid())[2]}

def alive(record):
    try:
        return stat(record["pid"])[2] == record["start"]
    except (OSError, ValueError, KeyError, TypeError):
        return False

def describe(record):
    return (f"{record.get('label', '?')} since {record.get('since', '?')} "
            f"(host process {record.get('pid')} {record.get('comm', '?')})")

def read(path):
    for _ in range(20):  # a lock being created has its holder file within milliseconds
        try:
            with open(os.path.join(path, "holder.json")) as handle:
                return json.load(handle)
        except (OSError, ValueError):
            time.sleep(0.05)
    return {}

os.makedirs(os.path.dirname(path), exist_ok=True) if mode == "take" else None
for attempt in range(3):
    record = read(path) if os.path.isdir(path) else None
    if record is not None and alive(record):
        print(f"locked by {describe(record)}: {path}")
        sys.exit(75)
    if mode == "check":
        print("free" if record is None else f"stale lock of {describe(record)}")
        sys.exit(0)
    if record is not None:
        aside = f"{path}.stale.{os.getpid()}"
        try:
            os.rename(path, aside)  # one of several recovering runs wins
            print(f"recovered a stale lock of {describe(record)}")
            os.system(f"rm -rf '{aside}'")
        except OSError:
            pass
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        continue
    mine = {**holder(), "label": label, "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with open(os.path.join(path, "holder.json.new"), "w") as handle:
        json.dump(mine, handle)
    os.rename(os.path.join(path, "holder.json.new"), os.path.join(path, "holder.json"))
    print(f"taken by {describe(mine)}")
    sys.exit(0)
print(f"could not take {path}")
sys.exit(75)
"""


class HostLocked(HeavyliftConfigError):
    """Another run holds the host's lock."""


def control_label() -> str:
    return f"pyinfra run of {getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()})"


def lock_command(path: str, mode: str = "take", label: str | None = None) -> StringCommand:
    return StringCommand("python3", "-c", QuoteString(SCRIPT), QuoteString(path), QuoteString(label or control_label()), mode)


def take(host, path: str, dry: bool = False) -> str:
    """Take the host's lock (or, in a dry run, look at it). Raises HostLocked naming the holder."""
    started = time.monotonic()
    status, output = host.run_shell_command(lock_command(path, "check" if dry else "take"))
    said = " ".join(output.stdout.split()) or output.stderr.strip()
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
