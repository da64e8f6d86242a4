"""The NVIDIA GPUs of a host as nvidia-smi reports them (the fact: operations/gpu.py); no GPU is a valid answer, never an error.

The fact prints tagged lines so that one command answers every case:

    gpu: 0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0, 97887, 580.95.05   (one per GPU)
    cuda: 13.0                                                                       (CUDA version the driver supports)
    absent                                                                           (no nvidia-smi on PATH)

Anything else nvidia-smi prints on the ``gpu:`` lines (its "couldn't communicate with the NVIDIA
driver" message, "No devices were found", an unknown query field on an old driver) becomes the
inventory's ``problem``: the host is reported as having no usable GPU, with nvidia-smi's own words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


# the nvidia-smi fields heavylift needs, in the order the fact parses them
QUERY_FIELDS = ("index", "name", "compute_cap", "memory.total", "driver_version")
NVIDIA_SMI_QUERY = f"nvidia-smi --query-gpu={','.join(QUERY_FIELDS)} --format=csv,noheader,nounits"
# `nvidia-smi --version` (drivers since ~2023) prints "CUDA Version : 13.0"; older ones only have it
# in the table header ("... CUDA Version: 12.2 |"), so fall back to the plain command
CUDA_VERSION = (
    "{ nvidia-smi --version 2>/dev/null || nvidia-smi 2>/dev/null; }"
    " | sed -n 's/.*CUDA Version *: *\\([0-9][0-9.]*\\).*/cuda: \\1/p' | head -n 1"
)
COMMAND = (
    "if command -v nvidia-smi >/dev/null 2>&1; then "
    f"{NVIDIA_SMI_QUERY} 2>&1 | sed 's/^/gpu: /'; {CUDA_VERSION}; "
    "else echo absent; fi"
)

GPU_LINE = re.compile(r"^\s*(\d+)\s*,\s*(.+?)\s*,\s*(\d+)\.(\d+)\s*,\s*([^,]+?)\s*,\s*(\S+)\s*$")
# unified-memory parts (GB10 / DGX Spark) report memory.total as "[N/A]" or "Not Supported"
NOT_AVAILABLE = {"[n/a]", "n/a", "[not supported]", "not supported"}


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_capability: tuple[int, int]
    memory_mib: int | None  # None: nvidia-smi does not report it (unified memory)

    @property
    def arch(self) -> str:
        """The CUDA architecture name, as in vLLM's and nvcc's sm_XY: (12, 0) -> 'sm120', (9, 0) -> 'sm90'."""
        major, minor = self.compute_capability
        return f"sm{major}{minor}"

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "name": self.name,
            "compute_capability": list(self.compute_capability),
            "memory_mib": self.memory_mib,
        }

    @classmethod
    def from_json(cls, data: dict) -> Gpu:
        major, minor = data["compute_capability"]
        return cls(data["index"], data["name"], (int(major), int(minor)), data.get("memory_mib"))


@dataclass(frozen=True)
class GpuInventory:
    """What a host has: its NVIDIA GPUs (maybe none), the driver and the CUDA version the driver supports."""

    gpus: tuple[Gpu, ...] = ()
    driver: str | None = None
    cuda: str | None = None
    problem: str | None = None  # why no GPU was found, in nvidia-smi's words; None when GPUs were found

    @property
    def count(self) -> int:
        return len(self.gpus)

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(sorted({gpu.arch for gpu in self.gpus}))

    @property
    def arch(self) -> str | None:
        """'sm120', 'sm90', ...: the one architecture of all GPUs; None without GPUs or with mixed ones."""
        archs = self.archs
        return archs[0] if len(archs) == 1 else None

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """The lowest compute capability of the GPUs (what a check for 'at least X' must use)."""
        return min((gpu.compute_capability for gpu in self.gpus), default=None)

    @property
    def min_memory_mib(self) -> int | None:
        """The smallest GPU's memory: tensor parallelism puts an equal share on each GPU."""
        known = [gpu.memory_mib for gpu in self.gpus if gpu.memory_mib is not None]
        return min(known) if known and len(known) == len(self.gpus) else None

    @property
    def total_memory_gib(self) -> float:
        return round(sum(gpu.memory_mib or 0 for gpu in self.gpus) / 1024, 1)

    def summary(self) -> str:
        """One line for logs and refusals, e.g. '8x NVIDIA RTX PRO 6000 ... (sm120, 95.6 GiB each), driver ..., CUDA 13.0'."""
        if not self.gpus:
            return f"no NVIDIA GPU ({self.problem or 'nvidia-smi listed none'})"
        groups: dict[tuple[str, str, int | None], int] = {}
        for gpu in self.gpus:
            key = (gpu.name, gpu.arch, gpu.memory_mib)
            groups[key] = groups.get(key, 0) + 1
        parts = []
        for (name, arch, memory), n in groups.items():
            size = f"{memory / 1024:.1f} GiB" if memory is not None else "memory not reported"
            parts.append(f"{n}x {name} ({arch}, {size}{' each' if n > 1 and memory is not None else ''})")
        tail = [f"driver {self.driver}"] if self.driver else []
        tail += [f"CUDA {self.cuda}"] if self.cuda else []
        return ", ".join([" + ".join(parts), *tail])

    def to_json(self) -> dict:
        return {
            "gpus": [gpu.to_json() for gpu in self.gpus],
            "driver": self.driver,
            "cuda": self.cuda,
            "problem": self.problem,
        }

    @classmethod
    def from_json(cls, data: dict) -> GpuInventory:
        return cls(
            gpus=tuple(Gpu.from_json(g) for g in data.get("gpus", ())),
            driver=data.get("driver"),
            cuda=data.get("cuda"),
            problem=data.get("problem"),
        )


def parse_nvidia_smi(lines: list[str]) -> GpuInventory:
    """The inventory from the fact's tagged output lines (see the module docstring)."""
    gpus: list[Gpu] = []
    drivers: list[str] = []
    cuda = None
    unparsed: list[str] = []
    absent = False
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if line == "absent":
            absent = True
        elif line.startswith("cuda:"):
            cuda = line[len("cuda:"):].strip() or None
        elif line.startswith("gpu:"):
            body = line[len("gpu:"):].strip()
            match = GPU_LINE.match(body)
            if not match:
                if body:
                    unparsed.append(body)
                continue
            index, name, major, minor, memory, driver = match.groups()
            memory_mib = None if memory.strip().lower() in NOT_AVAILABLE else _int_or_none(memory)
            gpus.append(Gpu(int(index), name, (int(major), int(minor)), memory_mib))
            drivers.append(driver)
        else:
            unparsed.append(line)

    if absent:
        return GpuInventory(problem="nvidia-smi is not installed (no NVIDIA driver on this host)")
    if not gpus:
        problem = " ".join(unparsed) if unparsed else "nvidia-smi listed no GPU"
        return GpuInventory(cuda=cuda, problem=problem)
    # one driver per host; keep the first if nvidia-smi ever disagreed with itself
    return GpuInventory(gpus=tuple(sorted(gpus, key=lambda g: g.index)), driver=drivers[0], cuda=cuda)


def _int_or_none(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None




def selected(inventory: GpuInventory, indexes: list[int] | None) -> GpuInventory:
    """The GPUs a deployment runs on: those the site names with ``gpus`` (all of them when it names none).

    The compatibility rules judge these, not every GPU of the host: a deployment pinned to two
    GPUs of an eight-GPU host has two GPUs' memory and none idle.
    """
    if indexes is None or not inventory.gpus:
        return inventory
    chosen = set(indexes)
    return GpuInventory(
        gpus=tuple(gpu for gpu in inventory.gpus if gpu.index in chosen),
        driver=inventory.driver, cuda=inventory.cuda, problem=inventory.problem,
    )
