"""
SSH test hosts: several throw-away "machines" on this one, each reachable by real SSH.

Every host is one ``sshd`` listening on ``127.0.0.1:<port>``, running in its own mount and
UTS namespaces (``unshare --mount --uts``) and chrooted into a copy-on-write view of the
machine's ``/`` (an overlay mount with ``lowerdir=/``). What a deploy writes to ``/opt`` or
``/etc`` lands only in that host's upper dir; the real machine never sees it. Each host has
its own hostname, ``/run``, ``/tmp`` and ``/dev/shm``, but shares the machine's network, so
services a test starts on loopback (a Hub mirror, say) are reachable from every host.

With ``network="bridge"`` each host also gets a network namespace of its own on a private bridge
(testbed/netns.py): sshd listens on the host's bridge address (10.200.0.11, .12, ...), the hosts
reach each other there and reach the control side on ``bed.network.switch_address``, and what
talks to them from the control side runs through ``bed.control_argv(argv)``. That is the bed for
several hosts that must talk to each other (one vLLM instance over two nodes).

    with TestBed(tmp_dir, names=["host1", "host2"]) as bed:
        bed.write_inventory(tmp_dir / "inventory.py", host_data={"host1": {...}})
        ...  # run pyinfra against it
        assert bed.hosts["host1"].run("cat /opt/x").stdout == "..."

Stopping a host kills every process living in its mount namespace (sshd, and whatever the
tests started through SSH, e.g. a vLLM server), which also takes its mounts away.

Needs root and ``openssh-server``. A small CLI keeps hosts up outside of pytest:

    python -m testbed.ssh_hosts up --base /var/tmp/hosts --names host1,host2
    python -m testbed.ssh_hosts down --base /var/tmp/hosts
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import posixpath
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from pprint import pformat
from typing import Any, Literal, Self

from testbed.netns import BridgeNetwork

SSHD = "/usr/sbin/sshd"
LOOPBACK = "127.0.0.1"
# The environment `run()` gives commands inside a host: what a fresh root login would have,
# not the test runner's (its PATH points into a virtualenv).
HOST_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
}
HOST_NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
STATE_FILE = "host.json"
NETWORK_STATE_FILE = "network.json"
BRIDGE_SSH_PORT = 22  # a host with its own network has port 22 to itself
# fresh mount and UTS namespaces; nothing mounted inside shows outside
UNSHARE = ["unshare", "--mount", "--uts", "--fork", "--propagation", "private"]


def ensure_openssh() -> None:
    if not Path(SSHD).exists():
        raise RuntimeError(
            f"{SSHD} is missing: the SSH test hosts need OpenSSH's server. "
            "Install it with `apt-get install -y --no-install-recommends openssh-server`.",
        )


def ensure_root() -> None:
    if os.geteuid() != 0:
        raise PermissionError("SSH test hosts need root (namespaces and overlay mounts)")


# Ports for test services come from below the kernel's ephemeral range (32768-60999 by default), one
# block per lane of the suite (test.sh runs lanes of modules side by side, each a pytest process with
# HEAVYLIFT_TEST_LANE set) or per pytest-xdist worker: a port handed out here but not yet listened on
# (a vLLM that starts a minute later) can then be taken neither by an outgoing connection's ephemeral port
# (a vLLM rank's, a test client's) nor by another lane's choice. Each block is walked in turn, so one
# process never hands out a port twice while the block lasts.
PORT_BLOCK_START, PORT_BLOCK_SIZE = 20000, 1500
_next_port_offset = 0


def _worker_index() -> int:
    lane = os.environ.get("HEAVYLIFT_TEST_LANE", "")
    if lane.isdigit():
        return int(lane)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # "gw0", "gw1", ...; unset outside xdist
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


def find_free_port() -> int:
    global _next_port_offset
    base = PORT_BLOCK_START + (_worker_index() % 8) * PORT_BLOCK_SIZE
    for _ in range(PORT_BLOCK_SIZE):
        port = base + _next_port_offset
        _next_port_offset = (_next_port_offset + 1) % PORT_BLOCK_SIZE
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {LOOPBACK} between {base} and {base + PORT_BLOCK_SIZE - 1}")


def port_accepts_tcp(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.2):
            return True
    except OSError:
        return False


def generate_ssh_key(path: Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )


def mount_namespace_id(pid: int) -> tuple[int, int] | None:
    """(device, inode) of a process's mount namespace; None if gone, a zombie or a kernel thread."""
    try:
        st = os.stat(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def process_root(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/root")
    except OSError:
        return None


def process_is_gone(pid: int) -> bool:
    # A killed orphan stays a zombie until PID 1 reaps it; it holds no namespace any more.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


SSHD_CONFIG = """\
# sshd of SSH test host {name} (written by testbed.ssh_hosts)
ListenAddress {address}:{port}
HostKey /run/testbed/ssh_host_ed25519_key
PidFile /run/sshd.pid
AuthorizedKeysFile /run/testbed/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# the key files sit in a test's temporary directory, owned and moded as it happens to be
StrictModes no
PrintMotd no
Subsystem sftp internal-sftp
"""

# Runs as the first process of the host's fresh mount + UTS namespaces (unshare made them,
# with private propagation so nothing mounted here shows outside), builds the host's root,
# then becomes the host's sshd.
BOOT_SCRIPT = """\
#!/bin/sh
set -eu
host_dir={host_dir}
root="$host_dir/root"

hostname {name}

# copy-on-write view of the machine's / : every write lands in $host_dir/upper
mount -t overlay overlay -o "lowerdir=/,upperdir=$host_dir/upper,workdir=$host_dir/work" "$root"
{seed_mounts}mount --rbind /dev "$root/dev"
# own /dev/shm, so shared-memory names of different hosts cannot collide
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount -t tmpfs -o mode=755 tmpfs "$root/run"
# own /tmp: also hides the test's temporary directory, other hosts' upper dirs included
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"

# sshd without PAM refuses keys for a locked account ("!" in shadow): unlock root, in this host
if grep -q '^root:!' "$root/etc/shadow"; then
    sed -i 's/^root:[^:]*:/root:*:/' "$root/etc/shadow"
fi

mkdir -p "$root/run/sshd" "$root/run/lock" "$root/run/testbed"
cp "$host_dir/sshd_config" "$host_dir/ssh_host_ed25519_key" "$root/run/testbed/"
cp "$host_dir/client_key.pub" "$root/run/testbed/authorized_keys"

# exec keeps this PID: it is the sshd's
echo $$ > "$host_dir/sshd.pid.tmp"
mv "$host_dir/sshd.pid.tmp" "$host_dir/sshd.pid"
exec chroot "$root" {sshd} -D -e -f /run/testbed/sshd_config
"""


@dataclass
class TestHost:
    """One SSH test host. Paths are as seen from outside the host."""

    __test__ = False  # not a pytest test class

    name: str
    port: int
    dir: Path  # everything the test bed made for this host lives here
    address: str = LOOPBACK  # where its sshd listens
    netns_path: str | None = None  # its own network namespace (bridge beds), else the machine's
    control_netns_path: str | None = None  # where the control side reaches it from
    # (host path, folder): the host starts with the folder's files at that path (``seed_mounts``)
    seeds: tuple[tuple[str, str], ...] = ()
    pid: int = 0  # the host's sshd (listener); its namespaces and root are the host's
    launcher_pid: int = 0  # `unshare`, waiting for the sshd
    namespace: tuple[int, int] | None = None  # (dev, inode) of its mount namespace
    _launcher: subprocess.Popen | None = field(default=None, repr=False)
    # An open handle on the mount namespace keeps it (and its inode number) ours until
    # stop(): nothing else can get that namespace identity while we compare against it.
    _namespace_fd: int | None = field(default=None, repr=False)
    _terminated: set[int] = field(default_factory=set, repr=False)

    @property
    def key(self) -> str:
        """Private key that logs in as root."""
        return str(self.dir / "client_key")

    @property
    def upper(self) -> Path:
        """Where everything the host writes lands."""
        return self.dir / "upper"

    @property
    def merged(self) -> Path:
        """The host's root as a path inside its own namespace (empty from outside)."""
        return self.dir / "root"

    @property
    def root(self) -> Path:
        """The host's whole filesystem view, readable from outside while it runs."""
        return Path(f"/proc/{self.pid}/root")

    def path(self, host_path: str) -> Path:
        """Outside path of a file the host wrote (only files it wrote or changed are there)."""
        return self.upper / host_path.lstrip("/")

    def view(self, host_path: str) -> Path:
        """Outside path of any file as the host sees it, while it runs."""
        return self.root / host_path.lstrip("/")

    def inventory_entry(self, **data: Any) -> tuple[str, dict[str, Any]]:
        """pyinfra inventory entry: the host's name, with connection data to reach it."""
        connection = {
            "ssh_hostname": self.address,
            "ssh_port": self.port,
            "ssh_user": "root",
            "ssh_key": self.key,
            # every test host gets a fresh host key: nothing to remember or check
            "ssh_known_hosts_file": "/dev/null",
            "ssh_strict_host_key_checking": "off",
        }
        return self.name, {**connection, **data}

    def ssh_argv(self, command: str) -> list[str]:
        """argv for the OpenSSH client running `command` on this host."""
        control = ["nsenter", f"--net={self.control_netns_path}", "--"] if self.control_netns_path else []
        return [
            *control,
            "ssh",
            "-p", str(self.port),
            "-i", self.key,
            "-o", "BatchMode=yes",
            "-o", "IdentitiesOnly=yes",
            "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR",
            f"root@{self.address}",
            command,
        ]  # fmt: skip

    def run(
        self,
        command: str | Sequence[str],
        check: bool = False,
        timeout: float | None = 60,
    ) -> subprocess.CompletedProcess:
        """Run a command inside the host (its filesystem, hostname and root), without SSH."""
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        return subprocess.run(
            self._enter() + argv,
            env=HOST_ENV,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def _enter(self, target: int | None = None) -> list[str]:
        """nsenter's argv into the host: its namespaces, its root and working folder (--root/--wd without a
        value: the target's). The target is the sshd, or while its SSH is cut (cut_ssh) a process it runs."""
        target = target or self.pid
        if process_is_gone(target):
            target = next(iter(self.processes()), target)
        net = ["--net"] if self.netns_path else []
        return ["nsenter", "--target", str(target), "--mount", "--uts", *net, "--root", "--wd", "--"]

    # Faults

    def cut_ssh(self, timeout: float = 10) -> list[int]:
        """SIGKILL the host's sshd and every SSH session (a crashed sshd, a host cut off): a control machine
        connected to it loses the connection; what the host runs (a vLLM) goes on. restore_ssh() undoes it."""
        sshds = [pid for pid in self.processes() if _comm(pid).startswith("sshd")]
        for pid in sshds:
            send_signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while any(not process_is_gone(pid) for pid in sshds):
            self.reap_launcher()
            if time.monotonic() > deadline:
                raise RuntimeError(f"test host {self.name}: sshd processes {sshds} survive SIGKILL")
            time.sleep(0.02)
        return sshds

    def restore_ssh(self, timeout: float = 10) -> None:
        """Start the host's sshd again inside the host, beside what runs there (after cut_ssh)."""
        others = self.processes()
        if not others:
            raise RuntimeError(f"test host {self.name}: nothing runs in it to start an sshd beside")
        listening = self.boot_log().count(f"Server listening on {self.address} port {self.port}.")
        self.pid = 0
        with open(self.dir / "boot.log", "ab") as log:
            self._launcher = subprocess.Popen(
                self._enter(others[0]) + [SSHD, "-D", "-e", "-f", "/run/testbed/sshd_config"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self.pid = self.launcher_pid = self._launcher.pid  # nsenter execs the sshd: one process
        self.save_state()
        deadline = time.monotonic() + timeout
        while self.boot_log().count(f"Server listening on {self.address} port {self.port}.") <= listening:
            if self._launcher.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"test host {self.name}: its sshd did not start again:\n{self.boot_log()[-2000:]}")
            time.sleep(0.02)

    # Starting

    def prepare(self) -> None:
        for folder in ("upper", "work", "root"):
            (self.dir / folder).mkdir()
        generate_ssh_key(self.dir / "ssh_host_ed25519_key", f"testbed-{self.name}-host")
        generate_ssh_key(self.dir / "client_key", f"testbed-{self.name}-client")
        (self.dir / "sshd_config").write_text(
            SSHD_CONFIG.format(name=self.name, address=self.address, port=self.port),
        )
        (self.dir / "boot.sh").write_text(
            BOOT_SCRIPT.format(
                host_dir=shlex.quote(str(self.dir)),
                seed_mounts=seed_mounts(self.seeds),
                name=shlex.quote(self.name),
                sshd=shlex.quote(SSHD),
            ),
        )

    def launch(self) -> None:
        with open(self.dir / "boot.log", "wb") as log:
            net = ["nsenter", f"--net={self.netns_path}", "--"] if self.netns_path else []
            self._launcher = subprocess.Popen(
                [*net, *UNSHARE, "--", "/bin/sh", str(self.dir / "boot.sh")],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # a Ctrl-C in the terminal is for pytest; stop() takes the host down
                start_new_session=True,
            )
        self.launcher_pid = self._launcher.pid

    def wait_until_ready(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        pid_file = self.dir / "sshd.pid"
        while time.monotonic() < deadline:
            if self._launcher is not None and self._launcher.poll() is not None:
                raise RuntimeError(f"test host {self.name} did not start:\n{self.boot_log()}")
            if not self.pid and pid_file.exists():
                self.pid = int(pid_file.read_text())
                try:
                    self.hold_namespace()
                except FileNotFoundError:
                    # sshd wrote its pid file and exited at once (e.g. its port taken): the
                    # launcher's exit, seen on the next turn, says so with the boot log
                    self.pid = 0
                    if self._launcher is not None:
                        try:
                            self._launcher.wait(timeout=10)
                        except subprocess.TimeoutExpired:
                            pass  # then "no sshd on port" at the deadline, with the boot log
                    continue
            # in a namespace of its own, the port can't be tried from here: sshd's word suffices
            reachable = self.netns_path is not None or port_accepts_tcp(self.port)
            if self.pid and self.sshd_is_listening() and reachable:
                return
            time.sleep(0.02)
        raise RuntimeError(
            f"test host {self.name}: no sshd on port {self.port} after {timeout} s\n"
            f"{self.boot_log()}",
        )

    def sshd_is_listening(self) -> bool:
        # sshd's own word, so that a stranger on the same port can't pass for it
        return f"Server listening on {self.address} port {self.port}." in self.boot_log()

    def hold_namespace(self) -> None:
        self._namespace_fd = os.open(f"/proc/{self.pid}/ns/mnt", os.O_RDONLY)
        st = os.fstat(self._namespace_fd)
        self.namespace = (st.st_dev, st.st_ino)
        self.save_state()

    def boot_log(self) -> str:
        try:
            return (self.dir / "boot.log").read_text(errors="replace")
        except OSError:
            return "(no boot log)"

    def save_state(self) -> None:
        state = {
            "name": self.name,
            "port": self.port,
            "address": self.address,
            "netns_path": self.netns_path,
            "control_netns_path": self.control_netns_path,
            "pid": self.pid,
            "launcher_pid": self.launcher_pid,
            "namespace": list(self.namespace) if self.namespace else None,
        }
        (self.dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def from_state(cls, host_dir: Path) -> TestHost:
        state = json.loads((host_dir / STATE_FILE).read_text())
        namespace = tuple(state["namespace"]) if state["namespace"] else None
        return cls(
            name=state["name"],
            port=state["port"],
            dir=host_dir,
            address=state.get("address", LOOPBACK),
            netns_path=state.get("netns_path"),
            control_netns_path=state.get("control_netns_path"),
            pid=state["pid"],
            launcher_pid=state["launcher_pid"],
            namespace=namespace,
        )

    # Stopping

    def processes(self) -> list[int]:
        """PIDs of every live process in the host's mount namespace."""
        if self.namespace is None:
            return []
        if self.namespace == mount_namespace_id(os.getpid()):
            # would be every process of the machine: a bug, never act on it
            raise RuntimeError(f"test host {self.name} claims the machine's own mount namespace")
        own_pid = os.getpid()
        return [
            pid
            for pid in all_pids()
            if pid != own_pid
            and mount_namespace_id(pid) == self.namespace
            and self.is_surely_ours(pid)
        ]

    def is_surely_ours(self, pid: int) -> bool:
        if self._namespace_fd is not None:
            return True  # the namespace identity is held: a match can only be ours
        # Without that hold (a later `down`), the inode could have been reused by a namespace
        # made since; also require the host's root, or the launcher.
        root = process_root(pid)
        if root is None:
            return False
        in_host_root = root == str(self.merged) or root.startswith(f"{self.merged}/")
        return in_host_root or pid == self.launcher_pid

    def terminate(self) -> None:
        """SIGTERM, once, every process in the host not sent one yet."""
        for pid in self.processes():
            if pid not in self._terminated:
                send_signal(pid, signal.SIGTERM)
                self._terminated.add(pid)

    def kill_processes(self, grace: float = 5) -> None:
        """SIGTERM everything in the host, SIGKILL what is left after `grace` seconds."""
        hard_limit = grace + 10
        started = time.monotonic()
        while True:
            self.terminate()
            self.reap_launcher()
            pids = self.processes()
            if not pids:
                return
            elapsed = time.monotonic() - started
            if elapsed > hard_limit:
                raise RuntimeError(f"test host {self.name}: processes {pids} survive SIGKILL")
            if elapsed > grace:
                for pid in pids:
                    send_signal(pid, signal.SIGKILL)
            time.sleep(0.05)

    def reap_launcher(self) -> None:
        if self._launcher is not None:
            self._launcher.poll()

    def release_namespace(self) -> None:
        # The last reference: the kernel unmounts the overlay, /proc, /run, ... with it.
        if self._namespace_fd is not None:
            os.close(self._namespace_fd)
            self._namespace_fd = None

    def kill_unbooted_launcher(self) -> None:
        # Stopped before its namespace was known (a failed or interrupted start): the launcher,
        # boot script and sshd still share the launcher's own session, no SSH session yet.
        if self.namespace is None and self._launcher is not None and self._launcher.poll() is None:
            os.killpg(self._launcher.pid, signal.SIGKILL)

    def adopt_unseen_sshd(self) -> None:
        # The sshd wrote its PID but start() was interrupted before reading it.
        pid_file = self.dir / "sshd.pid"
        if self.namespace is None and pid_file.exists():
            pid = int(pid_file.read_text())
            if process_root(pid) == str(self.merged):
                self.pid = pid
                try:
                    self.hold_namespace()
                except FileNotFoundError:  # it is gone already
                    pass

    def stop(self, grace: float = 5, remove: bool | Literal["later"] = True) -> None:
        """
        Kill every process of the host (SIGTERM, SIGKILL after `grace` seconds), let its
        mounts go, remove its files (``"later"``: moved aside now and removed in the background,
        ``wait_for_removals`` waits for them). Idempotent.
        """
        self.adopt_unseen_sshd()
        self.kill_unbooted_launcher()
        self.kill_processes(grace)
        if self._launcher is not None:
            try:
                self._launcher.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._launcher.kill()
                self._launcher.wait()
        self.release_namespace()
        self.namespace = None
        if remove == "later" and self.dir.exists():
            remove_later(self.dir)
        elif remove and self.dir.exists():
            shutil.rmtree(self.dir)


def seed_mounts(seeds) -> str:
    """The boot script's lines that give the host each seed's files at its host path, copy-on-write: an overlay of
    its own there, the folder its read-only lower layer, the host's writes in ``$host_dir/seeds/N``. (One more
    lower layer of the root's overlay would be simpler, but overlayfs refuses a layer inside another: the machine's
    / holds every folder.)"""
    lines = []
    for number, (host_path, folder) in enumerate(seeds):
        folder = Path(folder).resolve()
        if not posixpath.isabs(host_path) or not folder.is_dir() or any(c in str(folder) for c in ",:\\"):
            raise ValueError(f"a seed is (absolute host path, existing folder without ',' ':' '\\'): {(host_path, str(folder))}")
        work = f'"$host_dir/seeds/{number}"'
        target = '"$root"' + shlex.quote(posixpath.normpath(host_path))
        options = shlex.quote(f"lowerdir={folder},") + f'"upperdir=$host_dir/seeds/{number}/upper,workdir=$host_dir/seeds/{number}/work"'
        lines += [f"mkdir -p {work}/upper {work}/work {target}", f"mount -t overlay overlay -o {options} {target}"]
    return "".join(line + "\n" for line in lines)


# a stopped host's folder holds a 3.5 GB vLLM venv and its weights: tens of thousands of files, 10-20 s to
# remove. A test run need not wait for that before its next module: removed side by side with it
_REMOVALS: list[subprocess.Popen] = []


def remove_later(folder: Path) -> None:
    """Move ``folder`` aside at once (a name no host or bed uses) and remove it in the background."""
    aside = folder.with_name(f".removing-{folder.name}-{os.getpid()}-{time.monotonic_ns()}")
    folder.rename(aside)
    _REMOVALS.append(subprocess.Popen(["rm", "-rf", "--one-file-system", str(aside)]))


def wait_for_removals() -> None:
    """Wait for every background removal; the first that failed raises, naming its folder."""
    failed = []
    while _REMOVALS:
        removal = _REMOVALS.pop()
        if removal.wait() != 0:
            failed.append(removal.args[-1])
    if failed:
        raise RuntimeError(f"rm -rf failed for {failed}")


atexit.register(wait_for_removals)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def send_signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class TestBed:
    """A few SSH test hosts, started together under one base directory."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        base_dir: str | os.PathLike,
        names: Sequence[str] = ("host1", "host2"),
        start: bool = True,
        network: Literal["loopback", "bridge"] = "loopback",
        seeds: dict[str, str | os.PathLike] | None = None,
    ):
        """``seeds``: host path -> folder: every host starts with the folder's files there, copy-on-write (a venv
        built once for every bed: tests/conftest.py ``venv_seed``)."""
        self.base_dir = Path(base_dir).resolve()
        self.seeds = tuple((path, str(folder)) for path, folder in (seeds or {}).items())
        self.hosts: dict[str, TestHost] = {}
        if network not in ("loopback", "bridge"):
            raise ValueError(f"network is 'loopback' or 'bridge', not {network!r}")
        self.network_kind = network
        self.network: BridgeNetwork | None = None
        if isinstance(names, str):
            raise TypeError("names is a list of host names, not one string")
        check_host_names(names)
        check_base_dir(self.base_dir)
        if start:
            self.start(names)

    def start(self, names: Sequence[str], timeout: float = 10) -> None:
        ensure_root()
        ensure_openssh()
        atexit.register(self.stop)
        try:
            if self.network_kind == "bridge":
                self.base_dir.mkdir(parents=True, exist_ok=True)
                self.network = BridgeNetwork.create(state_path=self.base_dir / NETWORK_STATE_FILE)
            for name in names:
                # fails if the folder exists: it would be another bed's, never to be touched
                (self.base_dir / name).mkdir(parents=True)
                if self.network is not None:
                    netns_path, address = self.network.add_host(name)
                    host = TestHost(
                        name=name, port=BRIDGE_SSH_PORT, dir=self.base_dir / name, address=address,
                        netns_path=netns_path, control_netns_path=self.network.switch_path, seeds=self.seeds,
                    )
                else:
                    host = TestHost(name=name, port=find_free_port(), dir=self.base_dir / name, seeds=self.seeds)
                self.hosts[name] = host
                host.prepare()
                host.launch()
            # launch all first, then wait: the hosts boot side by side
            for host in self.hosts.values():
                host.wait_until_ready(timeout)
        except BaseException:
            self.stop()
            raise

    @classmethod
    def attach(cls, base_dir: str | os.PathLike) -> TestBed:
        """The hosts a previous process (e.g. `up`) left running under base_dir."""
        bed = cls(base_dir, names=(), start=False)
        network_state = bed.base_dir / NETWORK_STATE_FILE
        if network_state.exists():
            bed.network_kind = "bridge"
            bed.network = BridgeNetwork.load(network_state)
        for state_file in sorted(bed.base_dir.glob(f"*/{STATE_FILE}")):
            host = TestHost.from_state(state_file.parent)
            bed.hosts[host.name] = host
        return bed

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __getitem__(self, name: str) -> TestHost:
        return self.hosts[name]

    def write_inventory(
        self,
        path: str | os.PathLike,
        host_data: dict[str, dict[str, Any]] | None = None,
        groups: dict[str, Sequence[str]] | None = None,
    ) -> Path:
        """
        Write a pyinfra inventory file listing every host with its connection data, merged
        with `host_data` (per host name); `groups` maps group names to host names.
        """
        host_data = host_data or {}
        groups = groups or {}
        self.check_known(host_data, "host_data")
        for group, names in groups.items():
            if not group.isidentifier() or group.startswith("_") or group == "all":
                raise ValueError(f"group name {group!r} can't be an inventory variable")
            self.check_known(names, f"group {group!r}")

        entries = [
            host.inventory_entry(**host_data.get(name, {})) for name, host in self.hosts.items()
        ]
        lines = [
            f"# SSH test hosts under {self.base_dir}; written by testbed.ssh_hosts",
            "",
            f"all = {pformat(entries, sort_dicts=False)}",
        ]
        lines += [f"{group} = {list(names)!r}" for group, names in groups.items()]

        path = Path(path)
        path.write_text("\n".join(lines) + "\n")
        return path

    def check_known(self, names, what: str) -> None:
        unknown = sorted(set(names) - set(self.hosts))
        if unknown:
            raise ValueError(f"{what} names hosts this test bed doesn't have: {unknown}")

    def stop(self, grace: float = 5, remove: bool | Literal["later"] = True) -> None:
        """Stop every host (see TestHost.stop). Idempotent; safe after a failed start."""
        errors = []
        for host in self.hosts.values():  # let all hosts wind down side by side
            try:
                host.terminate()
            except Exception as error:
                errors.append(error)
        for host in self.hosts.values():
            try:
                host.stop(grace, remove=remove)
            except Exception as error:  # stop the others anyway
                errors.append(error)
        if self.network is not None:
            try:  # after the hosts: a namespace still holding processes would outlive its name
                self.network.destroy()
            except Exception as error:
                errors.append(error)
        if errors:
            raise errors[0]
        atexit.unregister(self.stop)

    def control_argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` as run from the control side: where the hosts' SSH addresses are reachable."""
        return self.network.argv(list(argv)) if self.network is not None else list(argv)

    def detach(self) -> None:
        """Leave the hosts running when this process exits (for `up`)."""
        atexit.unregister(self.stop)
        for host in self.hosts.values():
            host.release_namespace()


def check_host_names(names: Sequence[str]) -> None:
    for name in names:
        if not HOST_NAME_PATTERN.match(name):
            raise ValueError(f"{name!r} is not a usable host name (a-z, 0-9, -)")
    if len(set(names)) != len(names):
        raise ValueError(f"host names repeat: {list(names)}")


def check_base_dir(base_dir: Path) -> None:
    # the path goes into overlay mount options, where , and : are separators
    if re.search(r"[,:\s\\]", str(base_dir)):
        raise ValueError(f"base dir {base_dir} can't hold , : \\ or spaces (overlay options)")


# Command line


def command_up(args: argparse.Namespace) -> None:
    base_dir = Path(args.base)
    base_dir.mkdir(parents=True, exist_ok=True)
    bed = TestBed(base_dir, names=args.names.split(","), network=args.network)
    inventory = bed.write_inventory(base_dir / "inventory.py")
    bed.detach()
    for host in bed.hosts.values():
        print(f"{host.name}: {shlex.join(host.ssh_argv('hostname'))}")
    print(f"inventory: {inventory}")


def command_down(args: argparse.Namespace) -> None:
    bed = TestBed.attach(args.base)
    bed.stop()
    (Path(args.base) / "inventory.py").unlink(missing_ok=True)
    print(f"stopped: {', '.join(bed.hosts) or 'nothing'}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.ssh_hosts",
        description="Start or stop SSH test hosts outside of pytest.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start hosts and leave them running")
    up.add_argument("--base", required=True, help="directory for the hosts' files (not tmpfs)")
    up.add_argument("--names", default="host1,host2", help="comma separated host names")
    up.add_argument("--network", choices=("loopback", "bridge"), default="loopback",
                    help="bridge: each host in its own network namespace on a private bridge")
    up.set_defaults(handler=command_up)
    down = commands.add_parser("down", help="stop the hosts `up` started under --base")
    down.add_argument("--base", required=True)
    down.set_defaults(handler=command_down)
    args = parser.parse_args(argv)
    args.handler(args)


if __name__ == "__main__":
    main(sys.argv[1:])
