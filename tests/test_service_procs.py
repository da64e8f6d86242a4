"""operations/scripts/service_procs.py on real processes: a deployment's processes are found by their working
folder, the service's tree is told from an earlier start's leftovers, and ``end`` ends only the leftovers and
the segments no process holds."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "operations" / "scripts" / "service_procs.py"
USER = "root" if os.geteuid() == 0 else None
# a process that starts two children and waits, as vLLM's API server starts its engine core and ranks
PARENT = "import subprocess, sys, time; [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']) for _ in range(2)]; time.sleep(300)"
SLEEPER = "import time; time.sleep(300)"


def run(action, releases, pid_source, shm):
    import pwd

    user = pwd.getpwuid(os.geteuid()).pw_name
    return subprocess.run([sys.executable, str(SCRIPT), action, str(releases), user, pid_source],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "HEAVYLIFT_SHM_DIR": str(shm)})


def alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def children_of(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1]) == pid:
                    found.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return found


@pytest.fixture
def deployment(tmp_path):
    releases = tmp_path / "releases"
    (releases / "new0release1").mkdir(parents=True)
    (releases / "old0release0").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shm = tmp_path / "shm"
    shm.mkdir()
    started = []

    def start(code, cwd):
        process = subprocess.Popen([sys.executable, "-c", code], cwd=cwd)
        started.append(process)
        return process

    service = start(PARENT, releases / "new0release1")
    leftover = start(SLEEPER, releases / "old0release0")
    stranger = start(SLEEPER, elsewhere)
    pidfile = tmp_path / "serve.pid"
    pidfile.write_text(f"{service.pid}\n")
    deadline = time.monotonic() + 10
    while len(children_of(service.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield {"releases": releases, "shm": shm, "pid_source": f"pidfile:{pidfile}", "service": service,
           "leftover": leftover, "stranger": stranger}
    for process in started:
        for child in children_of(process.pid):
            try:
                os.kill(child, 9)
            except ProcessLookupError:
                pass
        process.kill()
        process.wait()


@pytest.mark.skipif(USER is None, reason="reads other processes' /proc/<pid>/cwd: needs root")
def test_list_tells_the_service_tree_from_an_earlier_starts_leftover(deployment):
    listed = run("list", deployment["releases"], deployment["pid_source"], deployment["shm"])
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)
    service = deployment["service"].pid
    assert found["main"] == service
    assert sorted(p["pid"] for p in found["service"]) == sorted([service, *children_of(service)])
    assert [(p["pid"], p["release"]) for p in found["leftovers"]] == [(deployment["leftover"].pid, "old0release0")]
    # a process that runs from anywhere else is not the deployment's
    assert deployment["stranger"].pid not in {p["pid"] for p in found["service"] + found["leftovers"]}


@pytest.mark.skipif(USER is None, reason="reads other processes' /proc/<pid>/cwd: needs root")
def test_end_ends_the_leftover_and_unheld_segments_only(deployment):
    shm = deployment["shm"]
    stale = shm / "vllm_dist_0123-tp:0-[0-1]-cpushm_1"
    stale.write_bytes(b"\0" * 4096)
    held = shm / "psm_held0001"
    held.write_bytes(b"\0" * 4096)
    other_family = shm / "someone-elses-segment"
    other_family.write_bytes(b"x")
    holder = subprocess.Popen([sys.executable, "-c", f"f = open({str(held)!r}, 'rb'); import time; time.sleep(300)"])
    # a live semaphore as glibc's sem_open makes it: a temporary file mapped, linked to its name, the temporary
    # name removed; /proc/<pid>/maps names only the temporary one
    semaphore = shm / "sem.mp-live0001"
    mapper = subprocess.Popen([sys.executable, "-c", (
        "import mmap, os, time\n"
        f"tmp = {str(shm / 'sem.Ab12cd')!r}\n"
        "fd = os.open(tmp, os.O_RDWR | os.O_CREAT, 0o600); os.write(fd, bytes(32))\n"
        "m = mmap.mmap(fd, 32); os.close(fd)\n"
        f"os.link(tmp, {str(semaphore)!r}); os.unlink(tmp)\n"
        "time.sleep(300)\n")])
    try:
        time.sleep(0.5)
        listed = json.loads(run("list", deployment["releases"], deployment["pid_source"], shm).stdout)
        assert [s["path"] for s in listed["stale_segments"]] == [str(stale)]
        ended = run("end", deployment["releases"], deployment["pid_source"], shm)
        assert ended.returncode == 0, ended.stderr
        assert f"ending pid {deployment['leftover'].pid}" in ended.stdout
        deployment["leftover"].wait(timeout=20)
        assert not alive(deployment["leftover"].pid)
        # the service and its children, the stranger, a held segment and another family are untouched
        service = deployment["service"].pid
        assert alive(service) and all(alive(child) for child in children_of(service)) and len(children_of(service)) == 2
        assert alive(deployment["stranger"].pid)
        assert not stale.exists() and held.exists() and other_family.exists() and semaphore.exists()
        # after a stop (no main process), every process of the deployment is a leftover
        deployment["service"].terminate()
        deployment["service"].wait()
        again = json.loads(run("list", deployment["releases"], deployment["pid_source"], shm).stdout)
        assert again["main"] is None and len(again["leftovers"]) == 2  # the two children, orphaned
        assert run("end", deployment["releases"], deployment["pid_source"], shm).returncode == 0
        assert json.loads(run("list", deployment["releases"], deployment["pid_source"], shm).stdout)["leftovers"] == []
    finally:
        for process in (holder, mapper):
            process.kill()
            process.wait()


@pytest.mark.skipif(USER is None, reason="chroot and other processes' /proc/<pid>/root: needs root")
def test_a_process_under_another_root_is_never_the_deployments(tmp_path):
    """A container or a test host sees the same paths as ours through a root of its own: its vLLM, of the same
    user, runs from a folder whose path reads like one of our releases. It is someone else's: never listed,
    never ended (test hosts whose pivot_root made the same path mean another folder killed each other's vLLM)."""
    releases = tmp_path / "releases"
    (releases / "theirs0release").mkdir(parents=True)
    shm = tmp_path / "shm"
    shm.mkdir()
    pidfile = tmp_path / "serve.pid"
    pidfile.write_text("")
    # a child that takes tmp_path as its root: its working folder, read from here, is <releases>/theirs0release
    # (the same text whether it went there before or after the chroot), and its root is another folder than ours
    child = subprocess.Popen([sys.executable, "-c", (
        "import os, time\n"
        f"os.chdir({str(releases / 'theirs0release')!r})\n"
        f"os.chroot({str(tmp_path)!r})\n"
        "time.sleep(300)\n")])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.stat(f"/proc/{child.pid}/root").st_ino == os.stat("/").st_ino:
            time.sleep(0.05)
        assert os.readlink(f"/proc/{child.pid}/cwd") == str(releases / "theirs0release")
        listed = run("list", releases, f"pidfile:{pidfile}", shm)
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout)["leftovers"] == []
        assert run("end", releases, f"pidfile:{pidfile}", shm).returncode == 0
        assert alive(child.pid)
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(USER is None, reason="chroot and other processes' /proc/<pid>/root: needs root")
def test_the_gpu_use_fact_names_no_deployment_for_a_process_under_another_root(tmp_path):
    """resolve/gpus.py's owner(): a GPU process of ours is named by its deployment; one under another root whose
    working folder reads the same is no deployment's (so the GPU preflight refuses it instead of ending it)."""
    from resolve.gpus import OWNER_SCRIPT

    deployments = tmp_path / "deployments"
    release = deployments / "dep1" / "releases" / "r1"
    release.mkdir(parents=True)
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], cwd=release)
    theirs = subprocess.Popen([sys.executable, "-c", (
        f"import os, time\nos.chdir({str(release)!r})\nos.chroot({str(tmp_path)!r})\ntime.sleep(300)\n")])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.stat(f"/proc/{theirs.pid}/root").st_ino == os.stat("/").st_ino:
            time.sleep(0.05)
        said = subprocess.run(["sh", "-c", f"{OWNER_SCRIPT}\nD={deployments}\nowner {ours.pid}; owner {theirs.pid}"],
                              capture_output=True, text=True, timeout=30)
        assert said.stdout.split("\n")[:2] == ["dep1", ""], said
    finally:
        for process in (ours, theirs):
            process.kill()
            process.wait()
