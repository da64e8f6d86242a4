"""The host's CPU set fact: the CPUs its processes may use and its NUMA nodes (resolve/cpus.py judges them)."""

from __future__ import annotations

from pyinfra.api import FactBase

from resolve.cpus import CPU_COMMAND, HostCpuSet, parse_cpus


class HostCpus(FactBase):
    """The allowed CPUs and NUMA nodes online (``HostCpuSet``), None where /proc does not say.

    Read with the other planning facts, in the same round trip (operations/factbatch.py).
    """

    def command(self) -> str:
        return CPU_COMMAND

    def process(self, output: list[str]) -> HostCpuSet | None:
        return parse_cpus(output)
