"""rollback.py's planning and report: the site's settings and the kept release's record read back from the host
(``fleet.HostState``) -> a rollback's plan (resolve/rollback.py), whose switch, service and gate the rollout's
stages carry out (operations/rollout.py)."""

from __future__ import annotations

from pyinfra import host, logger, state

from models.errors import HeavyliftConfigError
from models.validate import DataSources, load_deployment, origin_of
from resolve import rollback
from resolve.context import RunContext

from . import fleet, supervisor

# rollback.py's own option (--data release=<id>): left out of the site's data when rollback.py validates it, and
# only then (deploy.py validates without it, so it refuses the key as unknown there)
COMMAND_KEYS = frozenset({"release"})


def planned() -> tuple[rollback.RollbackPlan, RunContext]:
    """This host's rollback plan and the run's context. A release the host does not keep is refused, naming the
    field and what the host keeps, before any host changes."""
    context = RunContext.of_pyinfra(state, host)
    sources = DataSources.of_run(context)
    deployment = load_deployment(host, sources=sources, command_keys=COMMAND_KEYS)
    found = host.get_fact(fleet.HostState, root=deployment.settings.root)
    # the supervisor as a deploy's planning decides it (resolve/supervisor.py): the site's, or the host's init system
    init_system = supervisor.init_system(deployment.settings.service_manager)
    wanted = host.data.get("release")
    try:
        return rollback.make_rollback_plan(deployment, host.name, found, wanted, init_system), context
    except rollback.NoRollbackTarget as problem:
        where = origin_of(host, "release", sources).label if wanted else "rollback.py"
        raise HeavyliftConfigError(f"{where}, host '{host.name}': {problem} No host was changed.") from None


def reported(plan: rollback.RollbackPlan) -> None:
    """Which release goes back, from which (every run, also --dry)."""
    for line in plan.lines():
        logger.info(f"{host.print_prefix}{line}")
