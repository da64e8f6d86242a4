"""One vLLM instance over several hosts, rolled out as one unit: restarted together, gated once, rolled back together.

A multi-node group (resolve/nodes.py) is one tensor/pipeline-parallel world: a node restarted on its
own leaves the others waiting on a peer that is gone, and the group hangs. So in a group:

- **A change on one node restarts every node.** The service operation of each node asks whether the
  operations it depends on changed on *any* node of the group (``changed_in_group``). pyinfra 3.10
  runs each operation on every host before the next (api/operations.py ``_run_single_op``) and regenerates
  an operation's commands when it executes (api/operation.py ``command_generator``), so when a
  node's service operation runs, every node's earlier operations are done and their results are in
  ``state.ops``, under the same operation hash (made from the call site, the same on every host).
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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pyinfra.api import BaseStateCallback

# how often a waiting node looks at the board; a gevent-friendly sleep (pyinfra's CLI patches time.sleep)
POLL_SECONDS = 0.2


def changed_in_group(state, host, dependencies, group: tuple[str, ...]) -> list[str]:
    """The nodes of ``group`` (host names) on which one of ``dependencies`` changed in this run, in group order.

    ``dependencies`` are this host's OperationMeta; the other nodes' are found by the same hash. While
    planning (not executing) only this host's own will-change is known."""
    if not state.is_executing:
        return [host.name] if any(meta.will_change for meta in dependencies) else []
    changed = []
    for name in group:
        node = state.inventory.get_host(name)
        if node is None:
            continue
        for meta in dependencies:
            data = state.ops.get(node, {}).get(meta._hash)
            other = data.operation_meta if data is not None else None
            if other is not None and other.is_complete() and other.did_change():
                changed.append(name)
                break
    return changed


@dataclass
class Outcome:
    """What the leader posts: passed, or the rollback every node must make (and when its re-gate ended)."""

    passed: bool
    rollback: bool = False  # every node goes back to its previous release (the leader has one)
    restarted: set = field(default_factory=set)  # nodes whose rollback restart is done (or failed)
    regate_done: bool = False  # the leader's gate on the previous release has ended


class GroupBoard(BaseStateCallback):
    """One per run: each group's gate outcome, keyed by deployment (one group per deployment)."""

    def __init__(self):
        self.outcomes: dict[str, Outcome] = {}

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
    board = next((h for h in state.callback_handlers if isinstance(h, GroupBoard)), None)
    if board is None:
        board = GroupBoard()
        state.add_callback_handler(board)
    return board
