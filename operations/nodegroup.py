"""One vLLM instance over several hosts, rolled out as one unit: restarted together, gated once, rolled back together.

A multi-node group (resolve/nodes.py) is one tensor/pipeline-parallel world: a node restarted on its
own leaves the others waiting on a peer that is gone, and the group hangs. So in a group:

- **A change on one node restarts every node.** The service operation of each node asks whether the
  operations it depends on changed on *any* node of the group (``restart_causes``). pyinfra 3.10
  runs each operation on every host before the next (api/operations.py ``_run_single_op``) and regenerates
  an operation's commands when it executes (api/operation.py ``command_generator``), so when a
  node's service operation runs, every node's earlier operations are done and their results are in
  ``state.ops``, under the same operation hash (made from the call site, the same on every host).
- **So does a node whose vLLM must start though nothing changed**: it is not running (it died, was killed)
  or runs another release than ``current`` (a run killed between the switch and the restart). Its peers
  still run, waiting on a rank that is gone or from another start, so they restart with it. Each node
  posts why while the run is planned (``post_start_reason``: planning reads every host before any
  operation runs), and every node's service operation reads the others' posts.
- **A dry run shows it.** pyinfra plans the hosts side by side, so a node planned before the node that
  changes cannot know; the later node marks the same operation on the earlier ones as a change
  (``group_changes``), which is what pyinfra's "Detected changes" table reads.
- **Started together.** The restarts are one operation, run on the nodes side by side (pyinfra's
  gevent pool holds every host unless ``--parallel``/``--serial`` says less): vLLM's headless
  workers wait for the leader's torch.distributed store at ``--master-addr:--master-port`` and the
  leader waits for them (vLLM 0.11.1-0.32.0, ``MultiprocExecutor``), so no order is needed beyond
  "at the same time".
- **One gate, the leader's API.** The leader's gate runs as on a host of its own. Each worker waits for
  the leader's outcome (``GroupBoard``), then checks its own process and the leader's API.
- **A failed gate rolls every node back together.** The leader posts the rollback; every node (leader
  included) switches ``current`` back to its previous release and restarts at once; the leader gates
  again; every node then fails with the same story, so the run exits non-zero and says the group
  serves its previous release.

The board lives in the control process for one run (a pyinfra callback handler, as operations/waves.py
keeps its waves): nothing is sent between hosts but what vLLM itself sends.

``status.py`` judges a group as one instance too (``group_status``): its nodes read from the hosts (the
flags of the launcher ``current`` names: ``--nnodes``, ``--node-rank``, ``--master-addr``), failed when
any node's vLLM is not running, naming the node and what its supervisor and log say; ``groups_reported``
says each group on its leader's lines once every host is read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pyinfra import logger
from pyinfra.api import BaseStateCallback

from .runstate import handler_of

# how often a waiting node looks at the board; a gevent-friendly sleep (pyinfra's CLI patches time.sleep)
POLL_SECONDS = 0.2


# a node's cause of a group restart when one of the operations its service depends on changed there
CHANGED = "changed"


def restart_causes(state, host, dependencies, group: tuple[str, ...]) -> dict[str, str]:
    """Why ``group`` (host names) restarts in this run, by node in group order: ``CHANGED`` where one of
    ``dependencies`` (this host's OperationMeta; the other nodes' are found by the same hash) changed, else,
    for the other nodes, why their vLLM must start though nothing changed (``post_start_reason``).

    While planning (a dry run, a run that asks before it executes) a node planned after this one is not
    known yet: it marks this one when it changes (``group_changes``)."""
    reasons = board_of(state).start_reasons.get(tuple(group), {})
    failed = {h.name for h in state.failed_hosts}
    causes = {}
    for name in group:
        node = state.inventory.get_host(name)
        if node is None:
            continue
        if _changed_on(state, host, node, dependencies):
            causes[name] = CHANGED
        # a node whose run failed before its service starts nothing: its peers are left as they run
        elif node is not host and reasons.get(name) and name not in failed:
            causes[name] = reasons[name]
    return causes


def _changed_on(state, host, node, dependencies) -> bool:
    if node is host and not state.is_executing:
        return any(meta.will_change for meta in dependencies)
    for meta in dependencies:
        data = state.ops.get(node, {}).get(meta._hash)
        other = data.operation_meta if data is not None else None
        if other is None:
            continue
        if state.is_executing and other.is_complete() and other.did_change():
            return True
        # another node as planned: pyinfra's own change detection (its will_change would run as this host)
        if not state.is_executing and other._maybe_is_change:
            return True
    return False


def describe_causes(causes: dict[str, str]) -> str:
    return "; ".join(f"{name} changed" if why == CHANGED else f"{name}: {why}" for name, why in causes.items())


def post_start_reason(state, host, group: tuple[str, ...], reason: str | None) -> None:
    """While the run is planned: why this node's vLLM must start though nothing changed (None: it runs the
    current release), for every node's service operation to read when it runs."""
    board_of(state).start_reasons.setdefault(tuple(group), {})[host.name] = reason


def group_changes(state, host, group: tuple[str, ...]) -> None:
    """While planning: the operation this node is in changes on every node of ``group`` (a group restarts,
    and is gated, as one). pyinfra's "Detected changes" table reads each host's OperationMeta's
    ``_maybe_is_change`` (pyinfra_cli/prints.py ``print_meta``, 3.10); a node planned later finds the
    change itself."""
    if state.is_executing or not group:
        return
    for name in group:
        node = state.inventory.get_host(name)
        data = state.ops.get(node, {}).get(host.current_op_hash) if node is not None and node is not host else None
        if data is None or data.operation_meta._maybe_is_change is not False:
            continue
        data.operation_meta._maybe_is_change = True
        counts = state.get_meta_for_host(node)
        counts.ops_change += 1
        counts.ops_no_change -= 1


@dataclass
class Outcome:
    """What the leader posts: passed, or the rollback every node must make (and when its re-gate ended)."""

    passed: bool
    rollback: bool = False  # every node goes back to its previous release (the leader has one)
    restarted: set = field(default_factory=set)  # nodes whose rollback restart is done (or failed)
    regate_done: bool = False  # the leader's gate on the previous release has ended


class GroupBoard(BaseStateCallback):
    """One per run: each group's gate outcome, keyed by deployment (one group per deployment); why a node's
    vLLM must start though nothing changed, by group and node; status.py's host states."""

    def __init__(self):
        self.outcomes: dict[str, Outcome] = {}
        self.start_reasons: dict[tuple[str, ...], dict[str, str | None]] = {}
        self.host_states: dict[str, dict] = {}
        self.groups: list[dict] = []  # status.py's judged groups (group_status)

    def post(self, key, outcome: Outcome) -> None:
        self.outcomes[key] = outcome

    def wait(self, state, key, until, leader: str, timeout: float):
        """Block (cooperatively) until ``until(outcome)`` holds; None when the leader failed or ``timeout`` passed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            outcome = self.outcomes.get(key)
            if outcome is not None and until(outcome):
                return outcome
            if outcome is None and leader in {h.name for h in state.failed_hosts}:
                return None
            time.sleep(POLL_SECONDS)
        return None


def board_of(state) -> GroupBoard:
    return handler_of(state, GroupBoard)


# --- status.py: a group judged as one instance ---------------------------------------------------------------

# what makes a group's state, worst first
GROUP_STATES = ("failed", "stale", "starting", "unknown", "active")


def group_status(states: dict[str, dict]) -> list[dict]:
    """Every multi-node group the hosts' states show (scripts/host_state.py, by host name), judged as one vLLM
    instance: {"deployment", "nodes" (host names by rank, None where a rank was not read), "state", "problems"}.

    A group is its nodes' launchers agreeing on deployment, leader (``--master-addr:--master-port``) and
    ``--nnodes``. It is failed when any node's vLLM is not running: its peers wait on a rank that is gone
    (vLLM's leader may still answer /health), so the node and what its supervisor and log say are named;
    stale when a node runs another release than ``current``."""
    found: dict[tuple, dict[int, tuple[str, dict]]] = {}
    for host_name, host_state in states.items():
        for deployment, facts in (host_state or {}).get("deployments", {}).items():
            node = facts.get("node")
            if node:
                found.setdefault((deployment, node["leader"], node["nnodes"]), {})[node["rank"]] = (host_name, facts)
    judged = []
    for (deployment, _, nnodes), nodes in sorted(found.items()):
        problems, seen = [], {"active"}
        for rank in range(nnodes):
            if rank not in nodes:
                problems.append(f"node rank {rank}: not read (not in this run, not reached, or not deployed there)")
                seen.add("unknown")
                continue
            name, facts = nodes[rank]
            service, role = facts["service"], "leader" if rank == 0 else "headless"
            running = service.get("running_release")
            if service["state"] != "active":
                seen.add("starting" if service["state"] in ("starting", "restarting") else "failed")
                problem = f"{name} (rank {rank}, {role}): vLLM {service['state']}, {service.get('detail')}"
                if service.get("last_error"):
                    problem += f"; last error: {service['last_error']}"
                problems.append(problem)
            elif running and running != facts.get("current"):
                seen.add("stale")
                problems.append(f"{name} (rank {rank}, {role}): runs release {running}, not current {facts.get('current')}")
        judged.append({
            "deployment": deployment,
            "nodes": [nodes[rank][0] if rank in nodes else None for rank in range(nnodes)],
            "state": next(state for state in GROUP_STATES if state in seen),
            "problems": problems,
        })
    return judged


def group_line(group: dict) -> str:
    """One group as status.py says it: its nodes, its state, and what makes it so."""
    names = ", ".join(name or "?" for name in group["nodes"])
    line = f"group {group['deployment']} ({names}): {group['state']}"
    if group["problems"]:
        line += ": " + "; ".join(group["problems"])
    if group["state"] in ("failed", "stale"):
        line += ". The next deploy run restarts the group as one"
    return line


def status_read(state, host, host_state: dict) -> list[dict] | None:
    """status.py: this host's state read; once every host of the run is read, its groups judged (``group_status``),
    else None (a later host judges them)."""
    board = board_of(state)
    board.host_states[host.name] = host_state
    if {h.name for h in state.inventory.get_active_hosts()} - set(board.host_states):
        return None
    board.groups = group_status(board.host_states)
    return board.groups


def groups_reported(state, host, host_state: dict) -> None:
    """status.py: this host's state posted (``status_read``); once every host of the run is read, each multi-node
    group judged as one instance is said on its leader's lines (the first node read where the leader was not, this
    host where none was): info when it is active, a warning otherwise."""
    for group in status_read(state, host, host_state) or []:
        leader = state.inventory.get_host(next((name for name in group["nodes"] if name), host.name)) or host
        say = logger.info if group["state"] == "active" else logger.warning
        say(f"{leader.print_prefix}{group_line(group)}")
