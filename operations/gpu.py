"""The GPU facts: the host's NVIDIA GPUs, what is already on them and how they are linked, as nvidia-smi
reports them (parsed by resolve/gpus.py)."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase, StringCommand

from resolve.gpus import COMMAND, Gpu, GpuInventory, parse_nvidia_smi  # noqa: F401 (the fact's parts, for tests)
from resolve.gpus import TOPOLOGY_COMMAND, GpuUse, Topology, parse_gpu_use, parse_topology, use_command


class NvidiaGpus(FactBase):
    """The host's NVIDIA GPUs (``GpuInventory``); an empty inventory with a ``problem`` when there are none.

    The command always exits 0 and always prints something, so a host without nvidia-smi or
    without a working driver yields an inventory that says so instead of failing the run.
    """

    def command(self) -> str:
        return COMMAND

    def default(self) -> GpuInventory:
        return GpuInventory(problem="nvidia-smi printed nothing")

    def process(self, output: list[str]) -> GpuInventory:
        return parse_nvidia_smi(output)


class NvidiaGpuUse(FactBase):
    """Memory in use on each GPU and the compute processes holding it, each with the heavylift deployment it
    runs under (``GpuUse``), from nvidia-smi's --query-gpu and --query-compute-apps.

    + deployments_dir: ``<root>/deployments``: a process whose command line, or an ancestor's, runs from
      ``<deployments_dir>/<name>/`` belongs to deployment ``<name>``
    """

    def command(self, deployments_dir: str) -> StringCommand:
        # the folder is the script's $D, given as a quoted argument of its own
        return StringCommand("D=" + shlex.quote(deployments_dir.rstrip("/") or "/"), ";", use_command())

    def default(self) -> GpuUse:
        return GpuUse()

    def process(self, output: list[str]) -> GpuUse:
        return parse_gpu_use(output)


class NvidiaTopology(FactBase):
    """``nvidia-smi topo -m``: how each pair of GPUs is linked (``Topology``); read on hosts with several GPUs."""

    def command(self) -> str:
        return TOPOLOGY_COMMAND

    def default(self) -> Topology:
        return Topology(problem="nvidia-smi topo -m printed nothing")

    def process(self, output: list[str]) -> Topology:
        return parse_topology(output)
