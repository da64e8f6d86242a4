"""A two-node group rolled out through heavylift's own switch, service and gate operations, with a stand-in
for vLLM (testbed/stub_vllm.py): the leader serves the group's API, which answers only while every worker
runs the leader's release; a worker is a process that just lives. Used by tests/test_nodegroup.py to prove,
in seconds, that a change on one node restarts both, that a no-op restarts none, and that a failed leader
gate puts both nodes back on their previous release together.

    pyinfra inventory.py testbed/group_deploy.py --data release=r2 [--data bad=r2] [--data worker_release=r2+w]

Host data: ``folder`` (the node's deployment folder), ``rank``, ``group`` (the host names, leader first),
``port`` (the leader's stand-in API).
"""

import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyinfra import host  # noqa: E402
from pyinfra.operations import files  # noqa: E402

from operations import hostpython, readiness, release, service  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
folder, rank, group = host.data.folder, host.data.rank, tuple(host.data.group)
chosen = host.data.get("release", "r1")
port = host.data.port
pidfile, logfile, env_file = f"{folder}/run/serve.pid", f"{folder}/run/serve.log", f"{folder}/serve.env"
launcher = f"{folder}/current/serve"
workers = [f"{data['folder']}/run/serve.pid" for data in host.data.workers] if rank == 0 else []


def serve_script(name):
    if rank == 0 and name == host.data.get("bad"):
        return "#!/bin/sh\necho 'vllm: error: unrecognized arguments: --no-such-flag' >&2\nexit 2\n"
    if rank == 0:
        pidfiles = " ".join(workers)
        return f'#!/bin/sh\ncd "$(dirname "$0")"\nexec python3 {ROOT}/testbed/stub_vllm.py {port} {pidfiles}\n'
    return '#!/bin/sh\ncd "$(dirname "$0")"\nexec sleep 3600\n'


files.put(name="serve.env", src=io.StringIO(""), dest=env_file)
# a worker-only change: the worker's release differs, the leader's does not
name = host.data.get("worker_release") or chosen if rank > 0 else chosen
files.directory(name="release folder", path=f"{folder}/releases/{name}")
files.put(name="release launcher", src=io.StringIO(serve_script(name)),
          dest=f"{folder}/releases/{name}/serve", mode="755")
switched = release.current(name="current release", deployment_dir=folder, release=name)
# as operations/supervisor.py Supervisor.converged: a node that must start restarts its whole group
service.group_node_read(group, f"pidfile:{pidfile}", f"{folder}/releases", name)
restarted = service.daemon(name="service (start-stop-daemon)", launcher=launcher, env_file=env_file, pidfile=pidfile,
                           logfile=logfile, dependencies=[switched], grace_seconds=5, release=name,
                           releases_dir=f"{folder}/releases", group=group)
readiness.serving(
    name="vLLM ready", url=f"http://127.0.0.1:{port}", model="stand-in", endpoint=f"http://127.0.0.1:{port}/v1",
    budget_seconds=20, log_command=f"tail -n 5 {logfile}",
    gate=readiness.Gate(probe_script=str(hostpython.SCRIPTS_DIR / readiness.PROBE_SCRIPT),
                        pid_source=f"pidfile:{pidfile}", meta={"deployment": "stand-in", "release": name}, group=group),
    dependencies=[switched, restarted],
    rollback=readiness.Rollback(current_link=f"{folder}/current", previous_link=f"{folder}/previous",
                                releases_dir=f"{folder}/releases",
                                restart=tuple(service.daemon_restart(launcher, env_file, pidfile, logfile, [], 5))),
)
