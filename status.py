"""heavylift status: what every host of a site runs, read from the hosts themselves. Changes nothing.

    pyinfra -y inventory/<site>.py status.py                      one block of lines per host
    pyinfra -y inventory/<site>.py status.py --data json=true     the same as one JSON document on stdout
    pyinfra -y inventory/<site>.py status.py --limit gpu-node-1   some hosts only

For each host and each deployment under ``<root>/deployments/`` (also those the site no longer
names): the release ``current`` and ``previous`` point at, its vLLM build and model@commit, the
endpoint, the service as systemd or the fallback supervisor sees it (active, starting,
restarting, failed, stopped; the last error line of its log when it is not active), the last
readiness gate (load time, TTFT, decode tok/s; ``status.json``), GPUs and the memory its
processes hold (nvidia-smi), disk headroom, snapshots and venvs. One read-only fact per host
(operations/fleet.py ``HostState``): no operation, no upload, no lock taken.

``-y``: pyinfra asks for a confirmation before executing, even when there is nothing to execute.
JSON goes to stdout and nothing else does (pyinfra writes its own output to stderr), so
``... status.py --data json=true > fleet.json`` is a clean document for tools.
"""

import atexit
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pyinfra import host, logger, state

from operations import fleet
from resolve.layout import Layout

layout = Layout.of_host(host.data.get("root"))
# the deployment the site names for this host, to say when it is missing; the host's own folders decide the rest
expected = host.data.get("deployment") or host.data.get("model")
want_json = str(host.data.get("json", "")).lower() in ("1", "true", "yes")

found = host.get_fact(fleet.HostState, root=layout.root)
for line in fleet.host_lines(found, host.name, expected):
    logger.info(f"{host.print_prefix}{line}")

if want_json:
    if not fleet.COLLECTED:
        run_state = state

        def print_document():
            # hosts that failed (a connection that did not open) are said too, as not reached
            hosts = {h.name: {"error": "not reached"} for h in run_state.failed_hosts}
            hosts.update(fleet.COLLECTED)
            sys.stdout.write(json.dumps({"hosts": hosts}, indent=2, sort_keys=True) + "\n")
            sys.stdout.flush()

        atexit.register(print_document)
    fleet.COLLECTED[host.name] = fleet.host_document(found, expected)
