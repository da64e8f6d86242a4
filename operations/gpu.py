"""The GPU fact: the host's NVIDIA GPUs as nvidia-smi reports them (parsed by resolve/gpus.py)."""

from __future__ import annotations

from pyinfra.api import FactBase

from resolve.gpus import COMMAND, Gpu, GpuInventory, parse_nvidia_smi  # noqa: F401 (the fact's parts, for tests)


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
