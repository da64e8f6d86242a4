"""A rollback's plan: a kept release put back on a host, planned from that release's own record.

Control side, no SSH. The record is what scripts/host_state.py reads back from the host for each kept
release (operations/fleet.py ``HostState``): its id, model@commit, vLLM build, address, port and served
name. The plan has the parts of the stages a rollback shares with a deploy (operations/rollout.py): the
switch (``current`` -> the kept release, no release removed), the service (restarted as the deploy left
it) and the readiness gate (the release's own address and served name: a kept release may predate a site
edit). The site's settings give only what the record does not keep: the supervisor, the service user,
the gate's budget and benchmark, the address and name of a release recorded without them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .address import local_url, public_url
from .layout import Layout
from .plan import GatePart, ServicePart, SwitchPart, service_part


class NoRollbackTarget(ValueError):
    """What the operator asked for is not a release this host keeps (said before any change)."""


def short(release_id: str | None) -> str:
    return release_id or "none"


def rollback_target(state: dict, deployment: str, wanted: str | None) -> dict:
    """The kept release to put back: ``wanted`` (an id or a unique prefix of one), else ``previous``.

    Raises NoRollbackTarget naming what the host keeps and how to choose.
    """
    found = state["deployments"].get(deployment)
    if found is None:
        names = ", ".join(state["deployments"]) or "none"
        raise NoRollbackTarget(
            f"deployment {deployment!r} is not on this host (deployments under "
            f"{Layout.of_host(state['root']).deployments_dir}: {names}). "
            "Fix: choose the deployment with --data deployment=<name>."
        )
    kept = {r["id"]: r for r in found["releases"]}
    listing = ", ".join(
        f"{r['id']} ({r['model'] or '?'}, {r['vllm'] or '?'}{', current' if r['id'] == found['current'] else ''}"
        f"{', previous' if r['id'] == found['previous'] else ''})" for r in found["releases"]
    ) or "none"
    if wanted:
        matches = [rid for rid in kept if rid.startswith(str(wanted))]
        if len(matches) != 1:
            why = "matches several" if matches else "is not one of them"
            raise NoRollbackTarget(
                f"field 'release' ({wanted!r}) {why}: deployment {deployment!r} keeps releases {listing}. "
                "Fix: --data release=<one of those ids>."
            )
        return kept[matches[0]]
    previous = found["previous"]
    if not previous or previous == found["current"] or previous not in kept:
        raise NoRollbackTarget(
            f"deployment {deployment!r} has no previous release to go back to (current {short(found['current'])}, "
            f"previous {short(previous)}); it keeps releases {listing}. Fix: name one with --data release=<id>."
        )
    return kept[previous]


@dataclass(frozen=True)
class RollbackPlan:
    """One host's rollback: the parts of the switch, service and gate stages (operations/rollout.py)."""

    deployment: str
    layout: Layout
    was: str | None  # the release current before the rollback
    target: dict  # the kept release's record (scripts/host_state.py)
    switch: SwitchPart
    service: ServicePart
    gate: GatePart
    group: tuple[str, ...] = ()  # a rollback puts one host back (a multi-node group's restart is a deploy's)

    def lines(self) -> list[str]:
        target = self.target
        return [f"rollback of {self.deployment}: release {self.was} -> {target['id']} "
                f"({target['model']}, {target['vllm']})"]


def make_rollback_plan(deployment, host_name: str, host_state: dict, wanted: str | None,
                       init_system: str | None) -> RollbackPlan:
    """The rollback of ``deployment`` (models/validate.py) on the host whose state this is (``HostState``) to
    ``wanted`` (an id or prefix; None: ``previous``). Raises NoRollbackTarget before any host changes.

    + init_system: the host's running service manager, what service_manager "auto" is decided by
      (resolve/supervisor.py); None: not read
    """
    settings = deployment.settings
    target = rollback_target(host_state, deployment.name, wanted)
    found = host_state["deployments"][deployment.name]
    # the gate reads the served name and address from the release itself: a kept release may predate a site edit
    bind = target["host"] or settings.bind_address
    port = target["port"] or settings.port
    served = target["served_model_name"] or deployment.entry.serve.served_model_name or deployment.entry.hub.repo
    endpoint = f"{public_url(bind, port, host_name)}/v1"
    return RollbackPlan(
        deployment=deployment.name,
        layout=Layout(settings.root, deployment.name, settings.uv_cache_dir),
        was=found["current"],
        target=target,
        # a rollback removes no release
        switch=SwitchPart(release=target["id"], keep=len(found["releases"]) + 2,
                          label=f"current release {target['id']} (rollback)"),
        service=service_part(settings, init_system, restart_only=True),
        gate=GatePart(
            url=local_url(bind, port), model=served, endpoint=endpoint, budget_seconds=settings.readiness_timeout,
            benchmark_tokens=settings.benchmark_tokens,
            meta={
                "deployment": deployment.name,
                "release": target["id"],
                "vllm": target["vllm"],
                "model": target["model"],
                "endpoint": endpoint,
                "rolled_back_from": found["current"],
            },
        ),
    )
