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

A multi-node group is judged as the one vLLM instance it is, once every host is read, on its leader's
lines and under ``groups`` in the JSON: failed when any node's vLLM is not running (its peers may still
answer /health while they wait on it), naming the node and what its supervisor and log say
(operations/nodegroup.py ``group_status``).

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

from operations import fleet, nodegroup
from resolve.layout import Layout

layout = Layout.of_host(host.data.get("root"))
# the deployment the site names for this host, to say when it is missing; the host's own folders decide the rest
expected = host.data.get("deployment") or host.data.get("model")
want_json = str(host.data.get("json", "")).lower() in ("1", "true", "yes")

found = host.get_fact(fleet.HostState, root=layout.root)
for line in fleet.host_lines(found, host.name, expected):
    logger.info(f"{host.print_prefix}{line}")

# a multi-node group is one vLLM instance: judged whole once every host is read, on its leader's lines
for group in nodegroup.status_read(state, host, found) or []:
    leader = state.inventory.get_host(next((name for name in group["nodes"] if name), host.name)) or host
    say = logger.info if group["state"] == "active" else logger.warning
    say(f"{leader.print_prefix}{nodegroup.group_line(group)}")

if want_json:
    if not fleet.COLLECTED:
        run_state = state

        def print_document():
            # hosts that failed (a connection that did not open) are said too, as not reached
            hosts = {h.name: {"error": "not reached"} for h in run_state.failed_hosts}
            hosts.update(fleet.COLLECTED)
            # each multi-node group judged as one instance (operations/nodegroup.py group_status)
            groups = nodegroup.board_of(run_state).groups
            sys.stdout.write(json.dumps({"hosts": hosts, "groups": groups}, indent=2, sort_keys=True) + "\n")
            sys.stdout.flush()

        atexit.register(print_document)
    fleet.COLLECTED[host.name] = fleet.host_document(found, expected)
