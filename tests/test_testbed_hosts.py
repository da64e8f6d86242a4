"""The SSH test hosts themselves: real pyinfra reaches each one, and each keeps to itself."""

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import ssh_hosts
from testbed.ssh_hosts import TestBed, process_is_gone

pytestmark = pytest.mark.e2e

PYINFRA = Path(sys.executable).parent / "pyinfra"

DEPLOY = """\
from io import StringIO

from pyinfra import host
from pyinfra.operations import files, server

if "writers" in host.groups:
    files.put(
        name="Write the greeting",
        src=StringIO(host.data.greeting + "\\n"),
        dest="/opt/hello.txt",
    )

server.shell(
    name="Leave a trace on every host",
    commands=["hostname > /root/pyinfra-was-here"],
)
"""


def run_pyinfra(inventory: Path, deploy: Path, cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(PYINFRA), "-y", str(inventory), str(deploy)],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"pyinfra failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def bed(testbed_factory):
    return testbed_factory(["host1", "host2"])


def test_hosts_have_their_own_names(bed):
    names = {name: host.run("hostname", check=True).stdout for name, host in bed.hosts.items()}
    assert names == {"host1": "host1\n", "host2": "host2\n"}
    assert socket.gethostname() not in ("host1", "host2")


def test_pyinfra_deploy_lands_only_on_its_host(bed, tmp_path):
    assert not Path("/opt/hello.txt").exists(), "the machine itself has /opt/hello.txt already"
    inventory = bed.write_inventory(
        tmp_path / "inventory.py",
        host_data={"host1": {"greeting": "hello from heavylift"}},
        groups={"writers": ["host1"]},
    )
    deploy = tmp_path / "deploy.py"
    deploy.write_text(DEPLOY)

    run_pyinfra(inventory, deploy, cwd=tmp_path)

    host1, host2 = bed["host1"], bed["host2"]
    assert host1.run("cat /opt/hello.txt", check=True).stdout == "hello from heavylift\n"
    assert host1.path("/opt/hello.txt").read_text() == "hello from heavylift\n"
    assert host2.run("test -e /opt/hello.txt").returncode == 1
    assert not host2.path("/opt/hello.txt").exists()
    assert not Path("/opt/hello.txt").exists()
    # pyinfra reached both hosts, and each says who it is
    assert host1.run("cat /root/pyinfra-was-here").stdout == "host1\n"
    assert host2.run("cat /root/pyinfra-was-here").stdout == "host2\n"
    assert not Path("/root/pyinfra-was-here").exists()


def test_cut_ssh_drops_the_session_keeps_the_daemon_and_restore_brings_ssh_back(testbed_factory):
    bed = testbed_factory(["cut"])
    host = bed["cut"]
    start_daemon = ("start-stop-daemon --start --background --make-pidfile --pidfile /run/x.pid"
                    " --exec /bin/sleep -- 1000 && cat /run/x.pid")
    daemon_pid = int(subprocess.run(host.ssh_argv(start_daemon), capture_output=True, text=True, timeout=30,
                                    check=True).stdout)
    # a control machine's open connection, as pyinfra keeps one for the whole run
    session = subprocess.Popen(host.ssh_argv("sleep 600"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # the host's own sleeps: its PID namespace is the machine's, where other tests may sleep too
    from rollout_support import own_processes

    def own_sleeps():
        return len(re.findall(r"^\d+ (?:/bin/)?sleep ", own_processes(host, "root"), re.M))

    assert wait_for(lambda: own_sleeps() == 2)

    killed = host.cut_ssh()

    assert len(killed) >= 2  # the listener and the session's
    assert session.wait(timeout=10) != 0
    refused = subprocess.run(host.ssh_argv("true"), capture_output=True, text=True, timeout=30)
    assert refused.returncode == 255 and "refused" in refused.stderr, refused.stderr
    assert daemon_pid in host.processes()  # what the host runs goes on
    assert host.run("hostname").stdout == "cut\n"  # and the test still reaches it without SSH

    host.restore_ssh()

    back = subprocess.run(host.ssh_argv("hostname; cat /run/x.pid"), capture_output=True, text=True, timeout=30)
    assert back.returncode == 0 and back.stdout.split() == ["cut", str(daemon_pid)], back.stderr
    bed.stop()
    assert process_is_gone(daemon_pid) and not host.dir.exists()


def test_daemon_started_over_ssh_outlives_the_session_until_stop(testbed_factory):
    bed = testbed_factory(["daemons"])
    host = bed["daemons"]
    start_daemon = (
        "start-stop-daemon --start --background --make-pidfile --pidfile /run/x.pid"
        " --exec /bin/sleep -- 1000 && cat /run/x.pid"
    )
    session = subprocess.run(
        host.ssh_argv(start_daemon), check=False, capture_output=True, text=True, timeout=30
    )
    assert session.returncode == 0, session.stderr
    daemon_pid = int(session.stdout)

    # the SSH session is over; the daemon lives on, inside the host
    assert daemon_pid in host.processes()
    # start-stop-daemon writes the pidfile from its child, just before that execs sleep
    assert wait_for(lambda: host.run("cat /proc/$(cat /run/x.pid)/comm").stdout == "sleep\n")

    bed.stop()

    assert daemon_pid not in host.processes()
    assert process_is_gone(daemon_pid)
    assert not host.dir.exists()
    bed.stop()  # idempotent


def test_stopped_hosts_leave_no_mounts_behind(testbed_factory):
    bed = testbed_factory(["mounts"])
    host = bed["mounts"]
    overlay = f"upperdir={host.upper},"
    assert overlay in Path(f"/proc/{host.pid}/mountinfo").read_text()

    bed.stop()

    assert host.processes() == []
    assert not any(overlay in mounts for mounts in mount_tables_on_the_machine())


def test_a_folder_removed_later_is_gone_from_its_place_at_once_and_from_the_disk_after_the_wait(testbed_factory):
    bed = testbed_factory(["later"])
    host = bed["later"]
    host.run("mkdir -p /opt/many && for i in $(seq 200); do echo $i > /opt/many/$i; done")

    bed.stop(remove="later")

    assert not host.dir.exists() and host.processes() == []  # the name is free at once
    ssh_hosts.wait_for_removals()
    assert list(host.dir.parent.glob(".removing-*")) == []  # and the files are gone once waited for
    bed.start(["later"])  # a host of the same name starts in the same folder
    assert bed["later"].run("test -e /opt/many").returncode != 0


def test_a_seed_is_in_every_hosts_root_and_no_host_writes_to_it(tmp_path):
    seed = tmp_path / "seed"
    (seed / "sub").mkdir(parents=True)
    (seed / "sub" / "file").write_text("from the seed\n")
    with TestBed(tmp_path / "bed", ["s1", "s2"], seeds={"/opt/seeded": seed}) as bed:
        assert bed["s1"].run("cat /opt/seeded/sub/file").stdout == "from the seed\n"
        bed["s1"].run("echo changed > /opt/seeded/sub/file && rm -rf /opt/seeded/sub && touch /opt/seeded/new")
        assert bed["s2"].run("cat /opt/seeded/sub/file").stdout == "from the seed\n"  # the other host's view
        assert bed["s1"].run("ls /opt/seeded").stdout == "new\n"
        assert bed["s1"].run("stat -c %a /opt/seeded").stdout == "755\n"
    assert sorted(p.name for p in seed.rglob("*")) == ["file", "sub"]  # the seed itself is untouched
    assert (seed / "sub" / "file").read_text() == "from the seed\n"


def test_a_seed_whose_path_overlay_cannot_take_is_refused(tmp_path):
    odd = tmp_path / "a,b"
    odd.mkdir()
    with pytest.raises(ValueError, match="a seed is"):
        TestBed(tmp_path / "bed", ["s1"], seeds={"/opt/x": odd})


def wait_for(condition, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def mount_tables_on_the_machine():
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                yield (proc / "mountinfo").read_text()
            except OSError:  # gone meanwhile, or a zombie
                continue


def test_failed_start_cleans_up_after_itself(tmp_path, monkeypatch):
    if ssh_hosts.os.geteuid() != 0:
        pytest.skip("SSH test hosts need root (mount/UTS namespaces and overlay mounts)")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(ssh_hosts, "find_free_port", lambda: taken.getsockname()[1])

        with pytest.raises(RuntimeError, match="did not start") as failure:
            TestBed(tmp_path, names=["doomed"])

    assert "Cannot bind any address" in str(failure.value)  # sshd's own words, from the log
    assert not (tmp_path / "doomed").exists()
