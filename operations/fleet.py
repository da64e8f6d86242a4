"""Fleet status: what every host really runs, read from the host's own state (never the inventory alone).

The ``HostState`` fact runs ``scripts/host_state.py`` through ``python3 -c`` (nothing uploaded,
nothing written) and returns every deployment under ``<root>/deployments/``: its ``current`` and
``previous`` releases, each kept release's model@commit and vLLM build, the service as its
supervisor sees it (systemd or the fallback's pidfile) with the last error line of its log, the
last readiness gate's figures (``status.json``), GPUs and disk. ``status.py`` prints it;
``rollback.py``, ``retire.py`` and the snapshot collection (resolve/diskgc.py) decide from it.

status.py's steps: ``status_planned`` (what to read and how to say it, from the host's data), ``host_read`` (the
fact), ``host_reported`` (its lines), nodegroup.py ``groups_reported`` (each multi-node group judged as one) and
``document_collected`` (``--data json=true``: the host's document, kept for the run on its ``StatusDocuments``
and printed with every other host's as one JSON document on stdout when the run ends).
"""

from __future__ import annotations

import atexit
import json
import sys
from dataclasses import dataclass

from pyinfra import logger
from pyinfra.api import BaseStateCallback, FactBase, QuoteString, StringCommand

from models.validate import operator_settings
from resolve.address import url_host
from resolve.layout import Layout
from resolve.weights import human_bytes

from . import hostpython, nodegroup
from .runstate import handler_of
from .readiness import startup_text


class HostState(FactBase):
    """heavylift's state on a host under ``root`` (see scripts/host_state.py for the keys)."""

    def command(self, root, light=False):
        # light: no /health request, no nvidia-smi (deploy.py's snapshot collection needs neither)
        paths = json.dumps(Layout.of_host(root).host_state_paths(), separators=(",", ":"))
        return StringCommand(hostpython.PYTHON, "-c", QuoteString(hostpython.script("host_state.py")), QuoteString(paths),
                             *(["--light"] if light else []))

    def process(self, output):
        return json.loads("\n".join(output))


def short(release_id: str | None) -> str:
    return release_id or "none"


def _seconds(value) -> str:
    return f"{value} s" if value is not None else "?"


def deployment_lines(name: str, state: dict, endpoint_host: str | None = None) -> list[str]:
    """Two or three lines for one deployment: what serves, how the service is, the last gate."""
    releases = {r["id"]: r for r in state["releases"]}
    current = releases.get(state["current"] or "", {})
    status = state.get("status") or {}
    service = state["service"]
    kept = len(state["releases"])
    port = current.get("port")
    address = current.get("host")
    if address in ("0.0.0.0", "::") and endpoint_host:
        address = endpoint_host
    endpoint = status.get("endpoint") if status.get("release") == state["current"] and status.get("endpoint") else (
        f"http://{url_host(address or '?')}:{port}/v1" if port else "?")
    lines = [
        f"{name}: release {short(state['current'])} (previous {short(state['previous'])}, {kept} kept) "
        f"vLLM {current.get('vllm') or '?'} model {current.get('model') or '?'} endpoint {endpoint}"
    ]
    service_line = f"{name}: service {service['state']} ({service.get('manager')}: {service.get('detail')})"
    running = service.get("running_release")
    if running and running != state["current"]:
        service_line += f"; runs release {running}, not current"
    if service.get("health"):
        service_line += f"; /health {service['health']}"
    if service.get("restarts"):
        service_line += f"; {service['restarts']} restarts"
    if service.get("last_error"):
        service_line += f"; last error: {service['last_error']}"
    lines.append(service_line)
    if status:
        rate = status.get("tokens_per_second")
        gate = "passed" if status.get("healthy") and status.get("completion") is not None else "FAILED"
        gate_line = (
            f"{name}: last gate {status.get('checked_at', '?')} release {short(status.get('release'))} {gate}: "
            f"load {_seconds(status.get('load_seconds'))} ttft {_seconds(status.get('ttft_seconds'))} "
            + (f"decode {rate} tok/s" if rate is not None else f"decode - ({status.get('decode_note') or 'no figure'})")
        )
        if status.get("rolled_back_from"):
            gate_line += f" (rolled back from {status['rolled_back_from']})"
        lines.append(gate_line)
    else:
        lines.append(f"{name}: no readiness gate recorded (status.json missing)")
    gpus = current.get("gpus") or "all"
    memory = service.get("gpu_memory_mib")
    if memory is not None:
        lines[-1] += f"; GPUs {gpus}, {memory} MiB in use by its processes"
    if status.get("startup"):
        # where that gate's start went, read from its vLLM log (operations/readiness.py startup_text)
        lines.append(f"{name}: {startup_text(status['startup'])}")
    return lines


def host_lines(state: dict, host_name: str, expected: str | None = None) -> list[str]:
    """The status of one host, one fact per line, for pyinfra's output."""
    lines = []
    if not state["deployments"]:
        lines.append(f"no deployments under {Layout.of_host(state['root']).deployments_dir}")
    for name, deployment in state["deployments"].items():
        lines += deployment_lines(name, deployment, host_name)
    if expected and expected not in state["deployments"]:
        lines.append(f"{expected}: in the site but not deployed on this host")
    source = state.get("site_source")
    if source:  # this host serves its site's snapshots to the other hosts (operations/sitesource.py)
        detail = f"pid {source['pid']}" if source["state"] == "active" and source.get("pid") else source.get("detail")
        error = f"; last error: {source['last_error']}" if source.get("last_error") else ""
        lines.append(f"site source: {source['state']} ({source['manager']}, {detail}){error}")
    disk = state["disk"]
    snapshots = state["snapshots"]
    venvs = [v for v in state["venvs"] if v["complete"]]
    lines.append(
        f"disk: {human_bytes(disk['free_bytes'])} free of {human_bytes(disk['total_bytes'])} on {disk['path']}; "
        f"{len(snapshots)} snapshots ({human_bytes(sum(s['bytes'] for s in snapshots))}), {len(venvs)} venvs"
    )
    if state["gpus"] is None:
        lines.append("GPUs: none (no nvidia-smi)")
    else:
        lines.append("GPUs: " + "; ".join(
            f"{g['index']} {g['name']} {g['memory_used_mib']}/{g['memory_total_mib']} MiB"
            + (f" {g['utilization_percent']}%" if g.get("utilization_percent") is not None else "")
            for g in state["gpus"]
        ))
    return lines


def host_document(state: dict, expected: str | None = None) -> dict:
    """The JSON status of one host for tools: the host state with each deployment's summary on top."""
    deployments = {}
    for name, deployment in state["deployments"].items():
        releases = {r["id"]: r for r in deployment["releases"]}
        current = releases.get(deployment["current"] or "", {})
        status = deployment.get("status") or {}
        deployments[name] = {
            "release": deployment["current"],
            "previous": deployment["previous"],
            "kept_releases": [r["id"] for r in deployment["releases"]],
            "vllm": current.get("vllm"),
            "model": current.get("model"),
            "endpoint": status.get("endpoint") if status.get("release") == deployment["current"] else None,
            "service": deployment["service"],
            "last_gate": {k: status.get(k) for k in (
                "release", "healthy", "checked_at", "load_seconds", "ttft_seconds", "tokens_per_second",
                "decode_note", "benchmark_tokens", "rolled_back_from", "error", "startup")} if status else None,
            "gpus": current.get("gpus"),
            "releases": deployment["releases"],
        }
    document = {
        "root": state["root"],
        "checked_at": state["checked_at"],
        "disk": state["disk"],
        "gpus": state["gpus"],
        "snapshots": state["snapshots"],
        "venvs": state["venvs"],
        "deployments": deployments,
    }
    if expected and expected not in deployments:
        document["missing"] = [expected]
    return document


# --- status.py's steps --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StatusPlan:
    """What status.py reads of one host and how it says it, decided once from the host's data."""

    layout: Layout  # the host's root (``root``, else heavylift's default): its deployments are read from there
    expected: str | None  # the deployment the site names for this host, said when the host does not have it
    as_json: bool  # ``--data json=true``: the run also prints one JSON document on stdout


def status_planned(host) -> StatusPlan:
    """This host's StatusPlan. The host's own folders decide which deployments it has; the site's data only
    names the root, the deployment it expects there (``deployment``, else ``model``) and ``json``."""
    return StatusPlan(
        layout=Layout.of_host(operator_settings(host, ["root"])["root"]),
        expected=host.data.get("deployment") or host.data.get("model"),
        as_json=str(host.data.get("json", "")).lower() in ("1", "true", "yes"),
    )


def host_read(host, plan: StatusPlan) -> dict:
    """The host's own state under the plan's root: one read-only fact (``HostState``), no operation, no lock."""
    return host.get_fact(HostState, root=plan.layout.root)


def host_reported(host, found: dict, plan: StatusPlan) -> None:
    """The host's status as lines on pyinfra's output (``host_lines``), each with the host's prefix."""
    for line in host_lines(found, host.name, plan.expected):
        logger.info(f"{host.print_prefix}{line}")


class StatusDocuments(BaseStateCallback):
    """One per run (pyinfra's State, as nodegroup.py's ``GroupBoard``): status.py's JSON document of each host
    read, by host name, printed together when the run ends (``document_printed``). Two runs in one process (two
    States) never share documents."""

    def __init__(self):
        self.hosts: dict[str, dict] = {}
        self.printing = False  # document_printed is registered to run when the process exits


def documents_of(state) -> StatusDocuments:
    """The run's StatusDocuments, added to ``state``'s callback handlers the first time it is asked for."""
    return handler_of(state, StatusDocuments)


def document_collected(host, found: dict, plan: StatusPlan) -> None:
    """``--data json=true``: the host's document (``host_document``) kept on its run's StatusDocuments; the first
    host's call has the whole run's document printed when the process exits, after pyinfra's own output. The run
    is the State the host was initialised in (``host.state``): the object itself, not pyinfra's context proxy,
    which the exit would read outside any context."""
    if not plan.as_json:
        return
    run = host.state
    documents = documents_of(run)
    if not documents.printing:
        documents.printing = True
        atexit.register(document_printed, run)
    documents.hosts[host.name] = host_document(found, plan.expected)


def fleet_document(state) -> dict:
    """The run's JSON document: every host's document (a host that failed, such as a connection that did not open,
    as not reached) under ``hosts``, and each multi-node group judged as one instance (nodegroup.py
    ``group_status``) under ``groups``."""
    hosts = {h.name: {"error": "not reached"} for h in state.failed_hosts}
    hosts.update(documents_of(state).hosts)
    return {"hosts": hosts, "groups": nodegroup.board_of(state).groups}


def document_printed(state) -> None:
    """The run's document on stdout, the only thing status.py writes there (pyinfra writes to stderr)."""
    sys.stdout.write(json.dumps(fleet_document(state), indent=2, sort_keys=True) + "\n")
    sys.stdout.flush()
