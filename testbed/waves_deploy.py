"""A deploy that rolls a stand-in for the switch, restart and gate through operations/waves.py, as
deploy.py does, with no vLLM: each host's "switch" appends the time to ``/opt/waves/switched`` and
its "gate" fails on the host named by ``waves_fail``; the host named by ``waves_refuse`` is refused while the run
is prepared and left out, as deploy.py does with ``when_disk_too_small: proceed``. Used by tests/test_waves.py to
prove the order pyinfra runs the waves in and the hold after a failure, in seconds.

    pyinfra inventory.py testbed/waves_deploy.py [--data wave_size=1] [--data waves_fail=host2] [--data waves_refuse=host1]
"""

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyinfra import host, state  # noqa: E402
from pyinfra.operations import files, server  # noqa: E402

from operations import waves, weights  # noqa: E402
from resolve.waves import plan_waves  # noqa: E402


def _deployment(other):
    data = other.data
    settings = SimpleNamespace(wave_size=data.get("wave_size"), max_unavailable=data.get("max_unavailable"),
                               root=data.get("root", "/opt/heavylift"))
    return SimpleNamespace(name="stand-in", settings=settings)


FOLDER = host.data.get("waves_dir", "/opt/waves")
plan = plan_waves({h.name: _deployment(h) for h in host.inventory}, [h.name for h in host.inventory])
if host.data.get("waves_refuse") == host.name:  # as deploy.py: this host gets nothing else
    waves.excused(host, state, plan, "refused while prepared (stand-in)")
    weights.refused(name="refused (stand-in)", why=f"{host.name}: refused while prepared (stand-in)")
else:
    files.directory(name="prepared on every host at once", path=FOLDER)
    for wave in waves.rolling(host, state, plan):
        server.shell(name="switch (stand-in)", commands=[f"date +%s.%N >> {FOLDER}/switched && sleep 0.5"])
        failing = host.data.get("waves_fail") == host.name
        server.shell(name="gate (stand-in)", commands=["echo 'the gate fails' >&2; exit 3" if failing else "sleep 0.5"])
