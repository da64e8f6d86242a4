"""Which supervisor keeps a deployment's vLLM (and the site source's server) running: systemd, or the
start-stop-daemon fallback. Decided here, once per run, while planning (deploy.py through resolve/plan.py,
rollback.py); the plan carries the answer, and everything after planning (operations/supervisor.py,
operations/sitesource.py, operations/retire.py) only acts on it.

A deployment on a host keeps the answer it was given: the unit file is written only where the answer was
systemd, so scripts/host_state.py reads a deployment's supervisor back from that file (status.py, retire.py).
"""

from __future__ import annotations

SYSTEMD = "systemd"
FALLBACK = "fallback"
AUTO = "auto"


def asks_host(setting: str) -> bool:
    """Whether the site's ``service_manager`` leaves the choice to the host (its init system must be read)."""
    return setting == AUTO


def decided(setting: str, init_system: str | None) -> str:
    """systemd or fallback for the site's ``service_manager`` (auto, systemd, fallback) on a host whose running
    service manager is ``init_system`` (operations/service.py ``InitSystem``: "systemd" or "none"; None when
    not read). "auto" is systemd where systemd runs the host (sd_booted(3)), else the fallback."""
    if not asks_host(setting):
        return setting
    return SYSTEMD if init_system == SYSTEMD else FALLBACK
