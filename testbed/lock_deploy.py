"""A deploy that holds the host lock as deploy.py does (the fact batch on, ``hostlock.hold`` first,
``hostlock.released`` last) around steps the host data chooses: ``lock_pause_seconds`` (a pause on the
control machine before the first change, after the run has looked at the lock), ``lock_hold_seconds``
(a step on the host that waits, to kill the run in), ``lock_write`` (``PATH:WORD``, a step that
appends WORD to PATH) and ``lock_fail`` (a step that fails). Without a
step the run changes nothing. Used by tests/test_e2e_hostlock.py.

    pyinfra inventory.py testbed/lock_deploy.py [--data lock_hold_seconds=60] [--data lock_fail=true]
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyinfra import host, state  # noqa: E402
from pyinfra.operations import python, server  # noqa: E402

from operations import factbatch, hostlock  # noqa: E402
from resolve.context import RunContext  # noqa: E402

LOCK = host.data.get("lock_path", "/opt/heavylift/deploy.lock")
factbatch.activate(host)

hostlock.hold(host, state, LOCK, dry=RunContext.of_pyinfra(state, host).dry)
pause = int(host.data.get("lock_pause_seconds", 0))
if pause:
    python.call(name="a pause before the first change", function=lambda: time.sleep(pause))
seconds = int(host.data.get("lock_hold_seconds", 0))
if seconds:
    server.shell(name="a long step", commands=[f"sleep {seconds}"])
written = host.data.get("lock_write")  # "PATH:WORD": a step that appends WORD to PATH
if written:
    path, _, word = str(written).partition(":")
    server.shell(name="a step that writes", commands=[f"echo {word} >> {path}"])
if str(host.data.get("lock_fail", "")).lower() == "true":
    server.shell(name="a step that fails", commands=["echo 'this step fails' >&2; exit 3"])
hostlock.released(name="deploy lock given back", path=LOCK)
