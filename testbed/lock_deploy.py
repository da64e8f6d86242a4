"""A deploy that holds the host lock as deploy.py does (``hostlock.hold`` first, ``hostlock.released``
last) around steps the host data chooses: ``lock_hold_seconds`` (a step that waits, to kill the run
in) and ``lock_fail`` (a step that fails). Used by tests/test_e2e_hostlock.py.

    pyinfra inventory.py testbed/lock_deploy.py [--data lock_hold_seconds=60] [--data lock_fail=true]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyinfra import host, logger, state  # noqa: E402
from pyinfra.operations import server  # noqa: E402

from operations import hostlock  # noqa: E402
from resolve.context import RunContext  # noqa: E402

LOCK = host.data.get("lock_path", "/opt/heavylift/deploy.lock")

said = hostlock.hold(host, state, LOCK, dry=RunContext.of_pyinfra(state, host).dry)
if said.startswith(("recovered", "another run")):
    logger.warning(f"{host.print_prefix}{said}")
seconds = int(host.data.get("lock_hold_seconds", 0))
if seconds:
    server.shell(name="a long step", commands=[f"sleep {seconds}"])
if str(host.data.get("lock_fail", "")).lower() == "true":
    server.shell(name="a step that fails", commands=["echo 'this step fails' >&2; exit 3"])
hostlock.released(name="deploy lock given back", path=LOCK)
