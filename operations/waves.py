"""Waves: a fleet's release switch, restart and readiness gate, so many hosts at a time, in one pyinfra run.

A site sets ``wave_size`` or ``max_unavailable``; the waves are planned in resolve/waves.py. Everything that
does not touch the running service (uv, the venv, the download, the overlay, the release folder)
still runs on every host at once; the hosts of a deployment then switch ``current``, restart and
pass the readiness gate in waves, in inventory order. A failure stops the rollout: the failed host
was rolled back by its gate (operations/readiness.py), the wave's other hosts are put back with it,
and the hosts of later waves are held, untouched, on the release they serve. The run ends with the
hosts and the release each one runs, read from the hosts.

How, in pyinfra 3.10: the run executes operations in the order of a DAG made from every host's own
operation sequence (api/state.py ``get_op_order``: a TopologicalSorter over each host's
``op_hash_order``, ties broken by call-site line numbers), each operation on all its hosts before the
next (api/operations.py ``_run_single_op``). Every host emits one *wave barrier* per wave (``started``,
in ``host.loop`` so each wave's is its own operation) and the switch/restart/gate only inside its own
wave, after that wave's barrier. So wave k+1's barrier follows wave k's gate in some host's sequence,
and the DAG puts all of wave k before it. Whether a wave goes is decided when its barrier runs (any
host failed so far: held), and the wave's operations carry that decision as ``_if`` (``host.when``).
pyinfra's own knobs do not give waves: ``--serial``/``_serial`` and ``--parallel``/``_parallel`` still
run each operation across the fleet before the next (every host switched before any gate), and
``--serial`` would also download one host at a time; ``FAIL_PERCENT`` raises out of
``State.fail_hosts`` and ends the whole run at once, so no host gives its lock back and nothing says
which host runs what.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api import BaseStateCallback, FunctionCommand, OperationError, operation
from pyinfra.api.facts import get_fact
from pyinfra.context import host as current_host, state as current_state

from resolve.waves import WavePlan, plan_waves

from . import fleet, readiness
from .runstate import handler_of
from .service import changed_in_this_run

SUMMARY_NAME = "rollout summary (which hosts run what)"


def planned(host, context) -> WavePlan:
    """The run's waves, from every active host's validated settings (models/validate.py), the same on each host."""
    from models.validate import DataSources, origin_of, validated_deployments

    sources = DataSources.of_run(context)
    return plan_waves(validated_deployments(host), [h.name for h in host.inventory],
                      origin=lambda name, key: origin_of(host.inventory.get_host(name), key, sources).label)


class _Rollout(BaseStateCallback):
    """One per run: each wave's decision (taken when its barrier runs), the first failure, the summary."""

    def __init__(self, plan: WavePlan):
        self.plan = plan
        self.decisions: dict[int, str | None] = {}  # wave index -> why it is held (None: it goes)
        self.failures: list[tuple[str, str]] = []  # (host, what failed), in order
        self.rolled_back: dict[str, str] = {}  # host -> why it was put back with its wave
        self.excused: dict[str, str] = {}  # host -> why it was left out (refused while prepared): it holds no wave

    # pyinfra's callbacks (api/state.py BaseStateCallback)
    def host_connect_error(self, state, host, error):
        self.failures.append((host.name, "it could not be reached"))

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0):
        names = ", ".join(sorted(state.get_op_meta(op_hash).names))
        self.failures.append((host.name, f"{names!r} failed"))

    def operation_end(self, state, op_hash):
        if SUMMARY_NAME in state.get_op_meta(op_hash).names:
            for line in summary_lines(self, state):
                (logger.warning if self.failures else logger.info)(line)

    def decide(self, index: int, failed_hosts) -> str | None:
        """Held (why) or None: a wave goes only while no host of the run has failed."""
        if index not in self.decisions:
            counted = {h.name for h in failed_hosts} - set(self.excused)
            failed = [name for name, _ in self.failures if name in counted] or sorted(counted)
            if failed:
                first = next(((n, what) for n, what in self.failures if n == failed[0]), (failed[0], "it failed"))
                self.decisions[index] = f"the rollout stopped before {self.plan.label(index)}: {first[0]}: {first[1]}"
            else:
                self.decisions[index] = None
        return self.decisions[index]

    def goes(self, index: int) -> bool:
        return self.decisions.get(index) is None


def excused(host, state, plan: WavePlan, why: str) -> None:
    """``host`` was left out of this run while it was prepared (``when_disk_too_small: proceed``): its failure
    holds no wave of the other hosts; the summary still names it."""
    if plan.rolling:
        rollout_of(state, plan).excused[host.name] = why


def rollout_of(state, plan: WavePlan) -> _Rollout:
    return handler_of(state, _Rollout, make=lambda: _Rollout(plan),
                      added=lambda _: logger.info(f"--> Rolling out in {plan.describe()}"))


def rolling(host, state, plan: WavePlan):
    """``for wave in waves.rolling(host, state, plan): <switch, restart, gate>``: the body runs once, in
    the host's own wave, after that wave's barrier, its operations skipped (``_if``) when the wave is held.
    Without a wave setting the body runs once, as if there were no waves, and no barrier is added."""
    if not plan.rolling:
        yield None
        return
    rollout = rollout_of(state, plan)
    mine = plan.wave_of(host.name)
    for index in host.loop(range(len(plan.waves))):
        started(name=f"{plan.label(index)} starts", plan=plan, index=index)
        if index == mine:
            with host.when(lambda index=index: rollout.goes(index)):
                yield index
    summary(name=SUMMARY_NAME)


@operation()
def started(plan: WavePlan, index: int):
    """
    The barrier of one wave: every host has it, so the wave's operations follow the previous wave's gate.

    + plan: the waves
    + index: this wave (0 first)

    When it runs it decides whether the wave goes (no host of the run has failed) or is held.
    """
    host, state = current_host, current_state
    mine = plan.wave_of(host.name)
    if not state.is_executing:
        host.noop(f"{plan.label(mine)} switches after the waves before it pass their gates" if mine == index
                  else f"this host is in {plan.label(mine)}")
        return
    held = rollout_of(state, plan).decide(index, state.failed_hosts)
    if mine != index:
        host.noop(f"this host is in {plan.label(mine)}")
    elif held:
        # said in every run's output, not only with -v (pyinfra logs noops at debug level by default)
        logger.warning(f"{host.print_prefix}held: {held}; it keeps serving what it serves, untouched")
        host.noop("held")
    else:
        logger.info(f"{host.print_prefix}{plan.label(index)}: switch, restart and readiness gate now")
        host.noop("its wave goes")
    return
    yield  # an operation is a generator; this one only decides


@operation()
def rolled_back_with_wave(plan: WavePlan, index: int, switched, url: str, model: str, endpoint: str,
                          budget_seconds: int, log_command, gate: readiness.Gate, rollback: readiness.Rollback,
                          dependencies=None):
    """
    A host whose own gate passed goes back to its previous release when another host of its wave failed:
    a failed wave is rolled back whole, so the fleet is the waves before it on the new release and the
    rest on the old one.

    + plan, index: the waves and this host's wave
    + switched: the operation that switched ``current`` in this run (nothing to undo when it did not change)
    + url, model, endpoint, budget_seconds, log_command, gate, rollback: as readiness.serving
    """
    host, state = current_host, current_state
    if not state.is_executing:
        host.noop(f"only if another host of {plan.label(index)} fails its gate")
        return
    failed = sorted({h.name for h in state.failed_hosts} & set(plan.waves[index]))
    if not failed:
        host.noop(f"every host of {plan.label(index)} passed its gate")
        return
    if not changed_in_this_run([switched]):
        host.noop(f"{', '.join(failed)} of its wave failed, but this host's release did not change in this run")
        return
    yield FunctionCommand(_wave_put_back, (plan, index, failed, url, model, endpoint, budget_seconds, gate, rollback), {})


def _wave_put_back(state, host, plan, index, failed, url, model, endpoint, budget_seconds, gate, rollback):
    new = gate.meta.get("release")
    previous = readiness.release_of(host, rollback.previous_link)
    if not previous or previous == new:
        host.log_styled(f"{', '.join(failed)} of its wave failed and there is no previous release to go back to",
                        fg="red", log_func=logger.error)
        return False
    why = f"{', '.join(failed)} of {plan.label(index)} failed its gate: release {new} is rolled back with its wave"
    logger.warning(f"{host.print_prefix}{why}; rolling back to release {previous}")
    try:
        readiness.put_back(host, url, model, budget_seconds, endpoint, gate, rollback, new, previous)
    except OperationError as error:
        host.log_styled(str(error), fg="red", log_func=logger.error)
        return False
    rollout_of(state, plan).rolled_back[host.name] = why
    return True


@operation()
def summary():
    """
    The run's last word on the waves: every host of the plan and the release it runs, read from the hosts
    (also those that failed) when this operation ends (``_Rollout.operation_end``).
    """
    current_host.noop("the hosts and their releases are read when the rollout ends")
    return
    yield


def summary_lines(rollout: _Rollout, state) -> list[str]:
    plan = rollout.plan
    failed = dict(reversed(rollout.failures))  # host -> its first failure
    held = [index for index in range(len(plan.waves)) if rollout.decisions.get(index)]
    lines, serving = [], {}
    for index, hosts in enumerate(plan.waves):
        for name in hosts:
            host = state.inventory.get_host(name)
            try:
                # a host whose read fails is said, not failed: the run's outcome is the rollout's
                found = get_fact(state, host, fleet.HostState, kwargs={"root": plan.roots[name], "light": True},
                                 apply_failed_hosts=False)
                deployment = found["deployments"].get(plan.deployments[name]) or {}
            except Exception as error:  # noqa: BLE001 - an unreachable host is said, not raised
                lines.append(f"    wave {index + 1}: {name}: not read ({error})")
                continue
            service = deployment.get("service") or {}
            running = service.get("running_release") or "nothing"
            current = deployment.get("current") or "none"
            serving.setdefault(running, []).append(name)
            if name in failed:
                what = f"failed ({failed[name]})"
            elif name in rollout.rolled_back:
                what = "rolled back with its wave"
            elif index in held:
                what = "held, untouched"
            else:
                what = "rolled out"
            pid = f" (pid {service['pid']})" if service.get("pid") else ""
            mismatch = f", but current is {current}" if current not in ("none", running) else ""
            lines.append(f"    wave {index + 1}: {name}: runs release {running}{pid}{mismatch}: {what}")
    if not rollout.failures:
        head = f"--> Rollout: all {len(plan.waves)} waves rolled out"
    else:
        name, what = rollout.failures[0]
        where = f"wave {plan.wave_of(name) + 1}" if name in plan.deployments else "the run"
        kept = f"; waves {held[0] + 1}-{len(plan.waves)} were held" if held else ""
        head = f"--> Rollout stopped in {where} of {len(plan.waves)}: {name}: {what}{kept}"
    tail = "    " + "; ".join(f"release {release}: {', '.join(names)}" for release, names in serving.items())
    return [head, *lines, tail]
