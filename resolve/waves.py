"""The fleet's waves: which hosts switch, restart and pass the readiness gate together, decided from every host's
validated settings before any host changes.

A site sets ``wave_size`` (or ``max_unavailable``: a number of hosts or a share such as ``"25%"``,
rounded down and at least 1, as Kubernetes rounds a Deployment's maxUnavailable). The hosts of a
deployment are cut into waves in inventory order; wave k is the k-th chunk of every deployment.
operations/waves.py rolls the plan out in one pyinfra run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import zip_longest

from models.errors import HeavyliftConfigError


@dataclass(frozen=True)
class WavePlan:
    """The hosts of each wave (names, in order) and what decided it."""

    waves: tuple[tuple[str, ...], ...]
    per_wave: dict[str, int] = field(default_factory=dict)  # deployment -> hosts per wave (the site's setting)
    deployments: dict[str, str] = field(default_factory=dict)  # host -> deployment name
    roots: dict[str, str] = field(default_factory=dict)  # host -> heavylift's root on it

    @property
    def rolling(self) -> bool:
        return bool(self.per_wave)

    def wave_of(self, host_name: str) -> int:
        return next(index for index, hosts in enumerate(self.waves) if host_name in hosts)

    def label(self, index: int) -> str:
        return f"wave {index + 1} of {len(self.waves)} ({', '.join(self.waves[index])})"

    def describe(self) -> str:
        sizes = ", ".join(f"{name}: {size} at a time" for name, size in self.per_wave.items())
        return f"{len(self.waves)} waves ({sizes}): " + "; ".join(
            f"{index + 1}: {', '.join(hosts)}" for index, hosts in enumerate(self.waves))


def hosts_per_wave(settings, count: int) -> int | None:
    """The site's wave size for a deployment of ``count`` hosts; None when it rolls all at once."""
    if settings.wave_size is not None:
        return settings.wave_size
    bound = settings.max_unavailable
    if bound is None:
        return None
    if isinstance(bound, str):  # "25%": rounded down, at least one host (else the rollout never moves)
        return max(1, math.floor(count * int(bound.rstrip("%")) / 100))
    return bound


def plan_waves(deployments: dict, order: list[str], origin=None) -> WavePlan:
    """The waves of the hosts in ``deployments`` (host name -> validated Deployment), in inventory ``order``.

    Each deployment's hosts are cut into chunks of its wave size; wave k is the k-th chunk of every
    deployment. A deployment whose hosts disagree on the setting is refused (``origin(host, key)``
    names the file that set it), before any host changes.
    """
    by_deployment: dict[str, list[str]] = {}
    for name in order:
        if name in deployments:
            by_deployment.setdefault(deployments[name].name, []).append(name)
    chunks, per_wave = [], {}
    for deployment, hosts in by_deployment.items():
        settings = {name: (deployments[name].settings.wave_size, deployments[name].settings.max_unavailable) for name in hosts}
        first = hosts[0]
        for name in hosts[1:]:
            if settings[name] != settings[first]:
                key = "wave_size" if settings[name][0] != settings[first][0] else "max_unavailable"
                where = (lambda h: origin(h, key)) if origin else (lambda h: "the inventory")

                def shown(h):
                    value = settings[h][0 if key == "wave_size" else 1]
                    return "not set" if value is None else repr(value)

                raise HeavyliftConfigError(
                    f"{where(name)}, host '{name}': field '{key}' is {shown(name)} here but {shown(first)} for host "
                    f"'{first}' ({where(first)}) of the same deployment '{deployment}': one deployment rolls in one wave "
                    f"size. Fix: set {key} once for all of the deployment's hosts (in their group_data file or the "
                    "inventory's global data). No host was changed."
                )
        size = hosts_per_wave(deployments[first].settings, len(hosts))
        if size is not None and getattr(deployments[first].settings, "multinode", None) is not None:
            key = "wave_size" if deployments[first].settings.wave_size is not None else "max_unavailable"
            where = origin(first, key) if origin else "the inventory"
            raise HeavyliftConfigError(
                f"{where}, host '{first}': field '{key}' is set for the multi-node deployment '{deployment}': its "
                f"hosts ({', '.join(hosts)}) are one vLLM instance, restarted, gated and rolled back as one unit "
                "(a node restarted on its own would hang the others). Fix: remove the wave setting from this "
                "deployment; waves are for hosts that serve on their own. No host was changed."
            )
        if size is not None:
            per_wave[deployment] = size
        size = size or len(hosts)
        chunks.append([tuple(hosts[i:i + size]) for i in range(0, len(hosts), size)])
    waves = tuple(tuple(name for chunk in wave if chunk for name in chunk) for wave in zip_longest(*chunks, fillvalue=()))
    return WavePlan(
        waves=waves, per_wave=per_wave,
        deployments={name: d.name for name, d in deployments.items()},
        roots={name: d.settings.root for name, d in deployments.items()},
    )
