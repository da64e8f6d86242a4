"""What the rollout end-to-end tests share: fake secrets, and the places they must never reach
(every process's argv, world-readable files, logs), the serving API behind its key, and what a test host's
deployment folder says (the release ``current`` names, the pid in the fallback's pidfile)."""

import json
import os
import re
import stat
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from conftest import PYINFRA, REPO_ROOT, TEST_ROOT, PyinfraRun, run_pyinfra

# fake secrets, unique enough to find anywhere they leak
HF_TOKEN = "hf_heavyliftFAKEtoken7c1e9"
API_KEY = "sk-heavylift-FAKE-key-5b2d"
API_KEY_2 = "sk-heavylift-FAKE-rotated-9f3a"
SECRET_ENV = {"HEAVYLIFT_TEST_HF_TOKEN": HF_TOKEN, "HEAVYLIFT_TEST_API_KEY": API_KEY}
SECRETS = (HF_TOKEN, API_KEY, API_KEY_2)
SECRET_SOURCES = {"hf_token": "env:HEAVYLIFT_TEST_HF_TOKEN", "api_key": "env:HEAVYLIFT_TEST_API_KEY"}

# the deployment every rollout test host serves (the tiny model's, or another checkpoint under its name)
DEPLOYMENT_DIR = f"{TEST_ROOT}/deployments/tiny-llama"
PIDFILE = f"{DEPLOYMENT_DIR}/run/serve.pid"


def read_pid(host) -> int:
    """The pid of the fallback supervisor's vLLM (its pidfile)."""
    return int(host.run(f"cat {PIDFILE}").stdout.strip())


def current_release(host) -> str:
    """The release ``current`` names."""
    return host.run(f"readlink {DEPLOYMENT_DIR}/current").stdout.strip().rsplit("/", 1)[-1]


class ArgvWatcher:
    """Reads /proc/*/cmdline of every process every 50 ms; remembers any that holds a secret.

    Test hosts share this machine's PID namespace or have one nested in it: their processes are here too.
    """

    def __init__(self):
        self.hits: list[str] = []
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    argv = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if any(secret in argv for secret in SECRETS):
                    self.hits.append(argv[:300])
            self.scans += 1
            self._stop.wait(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def holds_secret(path: Path) -> bool:
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return any(secret.encode() in data for secret in SECRETS)


def world_readable_leaks(upper: Path, tmpfs_views: list[Path]) -> list[str]:
    """Files that hold a secret and that any user of the host can read.

    upper: the host's copy-on-write upper dir (everything it wrote on disk); tmpfs_views: its own
    /tmp, /run, /dev/shm seen from outside, where a temporary upload would land.
    """
    leaks = []
    for path in upper.rglob("*"):
        try:
            info = path.lstat()
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or not info.st_mode & stat.S_IROTH or info.st_size > 50_000_000:
            continue
        # world-readable only if every folder above it lets others in
        parents = [p for p in path.relative_to(upper).parents if str(p) != "."]
        if any(not (upper / p).stat().st_mode & stat.S_IXOTH for p in parents):
            continue
        if holds_secret(path):
            leaks.append(str(path))
    for folder in tmpfs_views:
        for path in folder.rglob("*"):
            try:
                if path.is_file() and path.stat().st_mode & stat.S_IROTH and path.stat().st_size < 50_000_000:
                    if holds_secret(path):
                        leaks.append(str(path))
            except OSError:
                continue
    return leaks


def api(base_url: str, path: str, body=None, key: str | None = API_KEY, timeout: float = 60):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    with urllib.request.urlopen(urllib.request.Request(base_url + path, data=data, headers=headers), timeout=timeout) as answer:
        return json.load(answer)


def complete(base_url: str, key: str | None = API_KEY, model: str | None = None):
    """A 4-token completion from the model the server serves (its /v1/models, behind the same key, unless named)."""
    if model is None:
        model = api(base_url, "/v1/models", key=key)["data"][0]["id"]
    return api(base_url, "/v1/completions", {"model": model, "prompt": "Hello", "max_tokens": 4}, key=key)


@dataclass
class ContendedRun:
    """A run, and a second run tried while the first held the host's lock."""
    pid: int
    returncode: int
    output: str
    blocked: PyinfraRun
    blocked_seconds: float


def run_while_a_second_run_tries(host, inventory: Path, lock_dir: str) -> ContendedRun:
    """Start a run of deploy.py; once its pid is in the host's lock, try a second run; wait for both."""
    first = subprocess.Popen(
        [PYINFRA, "-y", str(inventory), "deploy.py"], cwd=REPO_ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, **SECRET_ENV},
    )
    try:
        deadline = time.monotonic() + 120
        while f"(pid {first.pid})" not in host.run(f"cat {lock_dir}/holder.json 2>/dev/null").stdout:
            if time.monotonic() > deadline or first.poll() is not None:
                raise AssertionError(f"the first run never took the host lock: {lock_dir}")
            time.sleep(0.2)
        started = time.monotonic()
        blocked = run_pyinfra(inventory, env=SECRET_ENV)
        blocked_seconds = time.monotonic() - started
        output, _ = first.communicate(timeout=1200)
    finally:
        if first.poll() is None:
            first.kill()
    return ContendedRun(first.pid, first.returncode, output, blocked, blocked_seconds)


# --- the operator's commands (status.py, rollback.py, retire.py) -------------------------------


@dataclass
class StatusRun:
    run: PyinfraRun
    document: dict  # status.py's JSON (stdout)
    seconds: float


def status(inventory: Path, *args: str, env: dict | None = None, control=None) -> StatusRun:
    """status.py through the real CLI with --data json=true: the JSON from stdout, the lines from stderr.
    ``control``: how a bed's control side runs an argv (testbed's TestBed.control_argv, for a bridge's hosts)."""
    started = time.monotonic()
    argv = [PYINFRA, "-y", str(inventory), "status.py", "--data", "json=true", *args]
    done = subprocess.run(
        control(argv) if control else argv,
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
    )
    seconds = time.monotonic() - started
    try:
        document = json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"status.py printed no JSON on stdout:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}") from None
    return StatusRun(PyinfraRun(done.returncode, done.stderr), document, seconds)


def tree_state(host, folder: str, skip: tuple[str, ...] = ("/run/", "/home/")) -> dict[str, tuple]:
    """Every path under a host's folder with its type, size, mode and mtime (links: their target)."""
    listing = host.run(
        f"find {folder} -printf '%p\\t%y\\t%s\\t%m\\t%T@\\t%l\\n' 2>/dev/null | sort"
    ).stdout.splitlines()
    return {line.split("\t", 1)[0]: tuple(line.split("\t")[1:]) for line in listing
            if not any(part in line.split("\t", 1)[0] + "/" for part in skip)}


def kill_engine(pid: int, poke=None, timeout: float = 60) -> None:
    """The engine dies under vLLM's API server (as a GPU fault or the OOM killer would do it): SIGKILL to
    the API server's children, then ``poke()`` (a request that meets the dead engine); the server logs
    it and exits. Waits for it to be gone (SIGKILL after ``timeout``: a server without its engine is
    as dead to a client)."""
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            os.kill(int(child), 9)
        except ProcessLookupError:
            pass
    if poke is not None:
        try:
            poke()
        except Exception:  # noqa: BLE001 - a dead engine answers with an error, or not at all
            pass
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("State:"))
        except (OSError, StopIteration):
            return
        if "zombie" in state:
            return
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            time.sleep(1)
            return
        time.sleep(0.5)


def own_processes(host, user: str = "heavylift") -> str:
    """``pid args`` lines of ``user``'s processes on ``host`` itself. The SSH test hosts share this machine's PID
    namespace, so ``ps`` on one lists every host's (and a systemd host's, whose PID namespace is a child of it):
    only those that see the host's own root are its own."""
    script = ('r=$(stat -L -c %d:%i /); ps -u "$1" -o pid=,args= | while read -r pid args; do '
              '[ "$(stat -L -c %d:%i "/proc/$pid/root" 2>/dev/null)" = "$r" ] && echo "$pid $args"; done; true')
    return host.run(["sh", "-c", script, "sh", user]).stdout


def ranks(host, user: str = "heavylift") -> dict[int, int]:
    """{rank: pid} of the service user's vLLM worker processes on ``host`` (vLLM titles them VLLM::Worker_TP<n>)."""
    return {int(found.group(2)): int(found.group(1))
            for found in re.finditer(r"^\s*(\d+) VLLM::Worker_TP(\d+)", own_processes(host, user), re.M)}


def engine_cores(host, user: str = "heavylift") -> list[int]:
    return [int(found.group(1)) for found in re.finditer(r"^\s*(\d+) VLLM::EngineCore", own_processes(host, user), re.M)]


def rank_segments(host, user: str = "heavylift") -> list[str]:
    """The /dev/shm files ``user`` owns on ``host`` (vLLM's rank buffers and the CPU build's all-reduce segments)."""
    return sorted(host.run(f"find /dev/shm -maxdepth 1 -user {user} -printf '%f\\n'").stdout.split())


def run_killed_when(inventory: Path, condition, never: str, env: dict | None = None, timeout: float = 300) -> None:
    """A real deploy.py run, frozen (SIGSTOP) the instant ``condition()`` holds, so no later command goes out, then
    SIGKILLed: the state a control machine that dies at that point leaves. Fails the test with ``never`` when the run
    ends, or ``timeout`` passes, first."""
    import signal

    killed = subprocess.Popen([PYINFRA, "-y", str(inventory), "deploy.py"], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and killed.poll() is None:
            if condition():
                killed.send_signal(signal.SIGSTOP)
                return
            time.sleep(0.005)
        raise AssertionError(never)
    finally:
        killed.kill()
        killed.wait()


def wait_until(condition, timeout: float, what: str, step: float = 0.5):
    """condition() until it returns something true; fails the test naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(step)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")
