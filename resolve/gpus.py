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


# ---------------------------------------------------------------- what is already on the GPUs

# memory in use per GPU, and the compute processes that hold it (nvidia-smi's --query-compute-apps lists
# every process with a CUDA context: pid, process_name, used_memory, and the GPU by UUID)
USE_QUERY = "nvidia-smi --query-gpu=index,uuid,memory.used,memory.total --format=csv,noheader,nounits"
APPS_QUERY = "nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory,process_name --format=csv,noheader,nounits"
# for each process: the heavylift deployment it runs under, from its own command line or an ancestor's
# (vLLM's API server runs <root>/deployments/<name>/releases/<id>/venv/bin/python; its engine core and the
# tensor parallel workers are its descendants); "?" when the pid is not in this host's /proc (a
# container's PID namespace), empty when no ancestor is a deployment's or when the process sees another
# filesystem root than this host's (a container whose paths read like ours: not ours)
OWNER_SCRIPT = r"""
owner() {
  p=$1; n=0
  [ -r "/proc/$p/stat" ] || { echo "?"; return; }
  [ "$(stat -L -c %d:%i "/proc/$p/root" 2>/dev/null)" = "$(stat -L -c %d:%i /)" ] || { echo ""; return; }
  # the launcher's working folder, inherited by the engine core and every rank, also once orphaned
  w=$(readlink "/proc/$p/cwd" 2>/dev/null)
  case "$w" in "$D"/*) w=${w#"$D"/}; echo "${w%%/*}"; return;; esac
  while [ -n "$p" ] && [ "$p" -gt 1 ] && [ $n -lt 64 ]; do
    c=$(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null)
    case "$c" in *"$D"/*) c=${c#*"$D"/}; echo "${c%%/*}"; return;; esac
    p=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f2); n=$((n + 1))
  done
  echo ""
}
"""


def use_command() -> str:
    """The GPU-use fact's shell text: ``use: index, uuid, used, total`` per GPU and ``app: uuid, pid, used, name
    | owner`` per compute process (``$D``: the deployments folder, set by the caller)."""
    return (
        "if command -v nvidia-smi >/dev/null 2>&1; then "
        f"{USE_QUERY} 2>/dev/null | sed 's/^/use: /'; "
        f"{OWNER_SCRIPT.strip()}\n"
        f"{APPS_QUERY} 2>/dev/null | while IFS= read -r line; do "
        "pid=$(echo \"$line\" | cut -d, -f2 | tr -d ' '); "
        "case \"$pid\" in ''|*[!0-9]*) continue;; esac; "
        "echo \"app: $line | $(owner \"$pid\")\"; done; "
        "else echo absent; fi"
    )


@dataclass(frozen=True)
class GpuProcess:
    gpu: int  # the GPU's index
    pid: int
    name: str
    used_mib: int | None
    deployment: str | None  # the heavylift deployment it runs under; None: none; "?": pid not visible here

    def label(self) -> str:
        owner = {None: "", "?": ", not visible in this host's /proc"}.get(self.deployment, f", deployment '{self.deployment}'")
        used = f"{self.used_mib} MiB" if self.used_mib is not None else "memory not reported"
        return f"pid {self.pid} ({self.name}{owner}): {used}"

    def to_json(self) -> dict:
        return {"gpu": self.gpu, "pid": self.pid, "name": self.name, "used_mib": self.used_mib,
                "deployment": self.deployment}


@dataclass(frozen=True)
class GpuUse:
    """Memory in use on each GPU (index -> MiB; None where nvidia-smi reports none) and who holds it."""

    used_mib: dict = None  # type: ignore[assignment]
    total_mib: dict = None  # type: ignore[assignment]
    processes: tuple[GpuProcess, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "used_mib", dict(self.used_mib or {}))
        object.__setattr__(self, "total_mib", dict(self.total_mib or {}))

    def others(self, gpu: int, deployment: str) -> tuple[int | None, tuple[GpuProcess, ...]]:
        """(MiB held on ``gpu`` by processes that are not ``deployment``'s, those processes).

        Counts what nvidia-smi attributes to a process. Memory it attributes to none (a process in
        another PID namespace that the driver does not list here) is not counted: no refusal rests on
        memory nobody can name. None when nvidia-smi lists no memory for the GPU."""
        if gpu not in self.used_mib or self.used_mib[gpu] is None:
            return None, ()
        theirs = tuple(p for p in self.processes if p.gpu == gpu and p.deployment != deployment)
        return sum(p.used_mib or 0 for p in theirs), theirs

    def to_json(self) -> dict:
        return {"used_mib": {str(k): v for k, v in sorted(self.used_mib.items())},
                "total_mib": {str(k): v for k, v in sorted(self.total_mib.items())},
                "processes": [p.to_json() for p in self.processes]}


def parse_gpu_use(lines: list[str]) -> GpuUse:
    """The fact's ``use:`` and ``app:`` lines (see ``use_command``); anything else is ignored."""
    used: dict[int, int | None] = {}
    total: dict[int, int | None] = {}
    uuids: dict[str, int] = {}
    apps: list[tuple[str, int, int | None, str, str | None]] = []
    for raw in lines:
        line = raw.strip()
        if line.startswith("use:"):
            fields = [f.strip() for f in line[4:].split(",")]
            if len(fields) < 4 or not fields[0].isdigit():
                continue
            index = int(fields[0])
            uuids[fields[1]] = index
            used[index] = None if fields[2].lower() in NOT_AVAILABLE else _int_or_none(fields[2])
            total[index] = None if fields[3].lower() in NOT_AVAILABLE else _int_or_none(fields[3])
        elif line.startswith("app:"):
            body, _, owner = line[4:].rpartition("|")
            fields = [f.strip() for f in body.split(",", 3)]
            if len(fields) < 4 or not fields[1].isdigit():
                continue
            memory = None if fields[2].lower() in NOT_AVAILABLE else _int_or_none(fields[2])
            apps.append((fields[0], int(fields[1]), memory, fields[3], owner.strip() or None))
    processes = tuple(
        GpuProcess(uuids[uuid], pid, name, memory, owner)
        for uuid, pid, memory, name, owner in apps if uuid in uuids
    )
    return GpuUse(used, total, processes)


# ---------------------------------------------------------------- how the GPUs are linked

TOPOLOGY_COMMAND = "if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi topo -m 2>&1; else echo absent; fi"
# nvidia-smi topo -m's legend, fastest first (the NV# count is the bonded NVLinks)
LINK_MEANING = {
    "NV": "NVLink",
    "PIX": "PCIe, at most one bridge",
    "PXB": "PCIe, several bridges",
    "PHB": "PCIe through a host bridge (the CPU)",
    "NODE": "PCIe between host bridges of one NUMA node",
    "SYS": "PCIe and the link between CPU sockets (QPI/UPI)",
}


@dataclass(frozen=True)
class Topology:
    """``nvidia-smi topo -m``'s GPU x GPU matrix: (i, j) -> 'NV18', 'PIX', 'NODE', 'SYS', ..."""

    links: dict = None  # type: ignore[assignment]
    problem: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "links", dict(self.links or {}))

    def between(self, indexes) -> dict[str, list[tuple[int, int]]]:
        """link kind -> the pairs of the given GPUs joined by it (each pair once, lower index first)."""
        chosen = sorted(indexes)
        kinds: dict[str, list[tuple[int, int]]] = {}
        for n, a in enumerate(chosen):
            for b in chosen[n + 1:]:
                kind = self.links.get((a, b)) or self.links.get((b, a))
                if kind:
                    kinds.setdefault(kind, []).append((a, b))
        return kinds

    def describe(self, indexes) -> str:
        """One line for the plan, e.g. 'GPUs 0-7: NV18 (NVLink) between all 28 pairs'."""
        chosen = sorted(indexes)
        kinds = self.between(chosen)
        if not kinds:
            return f"GPUs {_span(chosen)}: topology not reported ({self.problem or 'no matrix'})"
        pairs = len(chosen) * (len(chosen) - 1) // 2
        parts = []
        for kind, found in sorted(kinds.items(), key=lambda item: (_link_rank(item[0]), item[0])):
            meaning = LINK_MEANING.get("NV" if kind.startswith("NV") else kind, "unknown link")
            count = f"all {pairs} pairs" if len(found) == pairs else f"{len(found)} of {pairs} pairs"
            parts.append(f"{kind} ({meaning}) between {count}")
        return f"GPUs {_span(chosen)}: " + "; ".join(parts)

    def to_json(self) -> dict:
        return {"links": {f"{a}-{b}": kind for (a, b), kind in sorted(self.links.items()) if a < b},
                "problem": self.problem}


def _link_rank(kind: str) -> int:
    order = ["NV", "PIX", "PXB", "PHB", "NODE", "SYS"]
    return 0 if kind.startswith("NV") else order.index(kind) if kind in order else len(order)


def _span(indexes: list[int]) -> str:
    if indexes and indexes == list(range(indexes[0], indexes[-1] + 1)) and len(indexes) > 2:
        return f"{indexes[0]}-{indexes[-1]}"
    return ", ".join(str(i) for i in indexes)


def parse_topology(lines: list[str]) -> Topology:
    """``nvidia-smi topo -m``: a header of column names (GPU0 ... NIC0 ... CPU Affinity ...), then one row per GPU
    and NIC, tab-separated, 'X' on the diagonal; the legend after it is ignored."""
    header: list[str] | None = None
    links: dict[tuple[int, int], str] = {}
    for raw in lines:
        if raw.strip() == "absent":
            return Topology(problem="nvidia-smi is not installed")
        cells = [cell.strip() for cell in (raw.split("\t") if "\t" in raw else raw.split())]
        if header is None:
            names = [cell for cell in cells if cell]
            if names and re.fullmatch(r"GPU\d+", names[0]):
                header = names
            continue
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            if raw.strip().startswith("Legend"):
                break
            continue
        row = int(cells[0][3:])
        values = cells[1:]
        # the GPU columns come first and are never empty ("X" on the diagonal)
        for column, value in zip(header, values):
            if not re.fullmatch(r"GPU\d+", column):
                break
            if value and value != "X":
                links[(row, int(column[3:]))] = value
    if header is None:
        text = " ".join(line.strip() for line in lines if line.strip())
        return Topology(problem=text[:200] or "nvidia-smi topo -m printed nothing")
    return Topology(links)
