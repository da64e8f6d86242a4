"""resolve/cpus.py: the CPUs a host lets its processes use, read from /proc and /sys (the HostCpus fact's output)."""

from resolve.cpus import HostCpuSet, parse_cpus


def test_host_cpus_fact_reads_the_affinity_and_numa_nodes():
    # /proc/self/status and /sys/devices/system/node/online, as this machine and a 2-socket server print them
    assert parse_cpus(["Cpus_allowed_list:\t0-1", "numa: 0"]) == HostCpuSet((0, 1), 1)
    assert parse_cpus(["Cpus_allowed_list:\t0-3,8-11", "numa: 0-1"]) == HostCpuSet((0, 1, 2, 3, 8, 9, 10, 11), 2)
    # no NUMA folder (some containers): one node
    assert parse_cpus(["Cpus_allowed_list:\t0-7", "numa: "]).numa_nodes == 1
    assert parse_cpus([]) is None


def test_the_kernels_cpu_lists_read_and_written_back():
    # Documentation/admin-guide/cputopology: ranges and single ids, comma-separated
    assert parse_cpus(["Cpus_allowed_list:\t8,0-2,1", "numa: 0"]).allowed == (0, 1, 2, 8)
    for text in ("0-3,8,10-11", "5", "0,2,4"):
        assert parse_cpus([f"Cpus_allowed_list:\t{text}"]).to_json() == {"allowed": text, "numa_nodes": 1}


def test_no_cpus_or_no_ranks_bind_nothing():
    """An empty VLLM_CPU_OMP_THREADS_BIND: the plan leaves vLLM's own binding alone."""
    assert HostCpuSet((), 1).thread_bind(2) == ""
    assert HostCpuSet((0, 1), 1).thread_bind(0) == ""
    assert HostCpuSet((4, 5, 6, 7), 1).thread_bind(1) == "4-7"
