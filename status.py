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

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pyinfra import host, state

from operations import fleet, nodegroup

# the host's root, the deployment the site names for it (said when it is missing; the host's own folders decide
# the rest), lines or also one JSON document
plan = fleet.status_planned(host)
# every deployment under the root, also those the site no longer names: one read-only fact
found = fleet.host_read(host, plan)
fleet.host_reported(host, found, plan)
# a multi-node group is one vLLM instance: judged whole once every host is read, on its leader's lines
nodegroup.groups_reported(state, host, found)
# --data json=true: this host's document kept for the run; the whole run's printed on stdout when it ends
fleet.document_collected(host, found, plan)
