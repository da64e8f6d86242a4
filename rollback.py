"""heavylift rollback: put a kept release back on chosen hosts, through the readiness gate.

    pyinfra -y inventory/<site>.py rollback.py                           previous release, every host
    pyinfra -y inventory/<site>.py rollback.py --limit gpu-node-1        one host
    pyinfra -y inventory/<site>.py rollback.py --data release=3f2a9c     a named kept release (id or prefix)
    pyinfra inventory/<site>.py rollback.py --dry                         say what would happen, change nothing

The site files are not changed: ``current`` moves to the chosen release (``previous`` to the one it
replaces), the service restarts, and the same readiness gate as a deploy checks it (/health, a
completion, the decode benchmark; ``status.json`` and the report line name the release). A
release that fails the gate is switched back to the one that served before and the run fails.

The site still describes the release it had: the next ``deploy.py`` run converges the host back to
it (a new switch and restart). Roll back, then fix the site (or the lock file) before the next run.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pyinfra import host, logger, state

from models.errors import HeavyliftConfigError
from models.validate import COMMAND_KEYS, DataSources, load_deployment, origin_of
from operations import fleet, hostlock, readiness, release, supervisor
from resolve import supervisor as supervisor_choice
from resolve.address import local_url, public_url
from resolve.context import RunContext
from resolve.layout import Layout

COMMAND_KEYS.add("release")
context = RunContext.of_pyinfra(state, host)
sources = DataSources.of_run(context)
deployment = load_deployment(host, sources=sources)
settings = deployment.settings
layout = Layout(settings.root, deployment.name, settings.uv_cache_dir)

found = host.get_fact(fleet.HostState, root=settings.root)
try:
    target = fleet.rollback_target(found, deployment.name, host.data.get("release"))
except fleet.NoRollbackTarget as problem:
    where = origin_of(host, "release", sources).label if host.data.get("release") else "rollback.py"
    raise HeavyliftConfigError(f"{where}, host '{host.name}': {problem} No host was changed.") from None
was = found["deployments"][deployment.name]["current"]
logger.info(f"{host.print_prefix}rollback of {deployment.name}: release {was} -> {target['id']} "
            f"({target['model']}, {target['vllm']})")

hostlock.hold(host, state, layout.lock, dry=context.dry)
switched = release.current(
    name=f"current release {target['id']} (rollback)", deployment_dir=layout.deployment_dir, release=target["id"],
    keep=len(found["deployments"][deployment.name]["releases"]) + 2,  # a rollback removes no release
)
# the supervisor as a deploy's planning decides it (resolve/supervisor.py): the site's, or the host's init system
manager = supervisor_choice.decided(settings.service_manager, supervisor.init_system(settings.service_manager))
running = supervisor.of(layout, manager, settings.service_user, settings.shutdown_timeout + 30)
supervisor.restarted(
    name=f"service restart ({running.manager})", commands=running.restart, dependencies=[switched],
    why=f"release {target['id']} is current already",
)

# the gate reads the served name and address from the release itself: a kept release may predate a site edit
bind = target["host"] or settings.bind_address
port = target["port"] or settings.port
served = target["served_model_name"] or deployment.entry.serve.served_model_name or deployment.entry.hub.repo
endpoint = f"{public_url(bind, port, host.name)}/v1"
readiness.serving(
    name="vLLM ready",
    url=local_url(bind, port),
    model=served,
    endpoint=endpoint,
    budget_seconds=settings.readiness_timeout,
    log_command=running.log_command,
    gate=readiness.Gate(
        probe_script=layout.probe_script,
        pid_source=running.pid_source,
        log_source=running.log_source,
        env_file=layout.env_file,
        status_file=layout.status_file,
        benchmark_tokens=settings.benchmark_tokens,
        meta={
            "deployment": deployment.name,
            "release": target["id"],
            "vllm": target["vllm"],
            "model": target["model"],
            "endpoint": endpoint,
            "rolled_back_from": was,
        },
    ),
    dependencies=[switched],
    rollback=readiness.Rollback(
        current_link=layout.current, previous_link=layout.previous, releases_dir=layout.releases,
        restart=running.restart,
    ),
)
# given back like a deploy's (it was left held: the next run said "recovered a stale lock")
hostlock.released(name="deploy lock given back", path=layout.lock)
