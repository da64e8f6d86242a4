"""
A test host with a real systemd as its PID 1, reachable by real SSH, on this one machine.

The recipe (docs/testing.md, "A real systemd for tests"), and the only way this project ever
starts a systemd manager outside a VM:

1. A cgroup of our own is made in every cgroup hierarchy this machine has mounted, below the
   cgroup the test runner is in; only the launching shell (a process we start) moves into it.
2. That shell execs ``unshare --pid --fork --kill-child --mount --uts --cgroup --net``: the
   host's cgroup namespace is rooted at our cgroup, so the cgroup2 tree systemd mounts and
   manages is that subtree and nothing above it; its PID namespace holds every process it runs.
3. The boot script mounts a copy-on-write view of the machine's ``/`` (overlay, as the SSH test
   hosts do), a minimal ``/dev`` (no disks, no consoles of the machine), fresh ``/proc`` with
   ``/proc/sys`` read-only (kernel-wide settings stay the machine's), a fresh read-only sysfs,
   tmpfs ``/run`` and ``/tmp``, then ``pivot_root`` and ``exec``s systemd with
   ``container=heavylift-testbed`` and a capability bounding set without module loading,
   raw I/O, clock setting or network administration (what ``systemd-nspawn`` drops too).
4. systemd boots ``heavylift-testbed.target``: ``basic.target`` plus an sshd unit. gettys,
   timers and the machine's own enabled services (postgresql, ssh, ...) are masked.
5. The host has its own network namespace, joined to this machine by a veth pair on a /30
   of 10.213.0.0/16: the test reaches the host's sshd (and vLLM) at ``host.address``, the
   host reaches services a test binds to ``host.gateway``. Nothing else: no route out.
6. Stop: SIGRTMIN+4 to the host's systemd, its poweroff signal (every unit stops as on a real
   shutdown), SIGKILL of the namespace's PID 1 if that takes too long, then our cgroups are removed. ``check_machine_cgroups``
   fails loudly if PID 1's or the runner's cgroups changed.

    with SystemdHost(tmp_dir, "sd1") as host:
        host.write_inventory(tmp_dir / "inventory.py", {...})
        host.run("systemctl is-system-running")

Needs root, openssh-server and systemd (Debian 12 ships 252).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from pprint import pformat
from typing import Any, Self

from testbed.ssh_hosts import (
    HOST_ENV,
    HOST_NAME_PATTERN,
    SSHD,
    check_base_dir,
    ensure_openssh,
    ensure_root,
    generate_ssh_key,
)

SYSTEMD = "/lib/systemd/systemd"
CONTAINER_NAME = "heavylift-testbed"
TARGET = "heavylift-testbed.target"
SSHD_UNIT = "heavylift-testbed-sshd.service"
NETWORK = ipaddress.ip_network("10.213.0.0/16")
SSH_PORT = 22
# what systemd-nspawn also keeps from a container (systemd-nspawn(1), --capability=): no module
# loading, raw I/O, clock or network administration
DROPPED_CAPABILITIES = (
    "sys_module", "sys_rawio", "sys_time", "syslog", "wake_alarm", "net_admin",
    "sys_pacct", "block_suspend", "mac_admin", "mac_override",
)
# Units of this machine's own that must not start in a test host: logins on consoles, timers
# that run apt or fstrim, the machine's services, and anything touching kernel-wide state
MASKED_UNITS = (
    "getty.target", "getty@.service", "console-getty.service", "container-getty@.service",
    "serial-getty@.service", "getty-static.service",
    "apt-daily.timer", "apt-daily-upgrade.timer", "dpkg-db-backup.timer", "e2scrub_all.timer",
    "e2scrub_reap.service", "fstrim.timer", "man-db.timer", "logrotate.timer", "systemd-tmpfiles-clean.timer",
    "cron.service", "postgresql.service", "ssh.service", "ssh.socket", "sshd.service", "rsync.service",
    "systemd-timesyncd.service", "systemd-modules-load.service", "systemd-binfmt.service",
    "proc-sys-fs-binfmt_misc.automount", "proc-sys-fs-binfmt_misc.mount", "systemd-sysctl.service",
    "systemd-udevd.service", "systemd-udev-trigger.service", "systemd-udev-settle.service",
    "systemd-pstore.service", "systemd-random-seed.service", "systemd-logind.service",
    "systemd-firstboot.service", "remote-fs.target", "swap.target", "cryptsetup.target",
    "sys-kernel-debug.mount", "sys-kernel-tracing.mount", "sys-kernel-config.mount",
    "sys-fs-fuse-connections.mount", "dev-hugepages.mount", "dev-mqueue.mount", "kmod-static-nodes.service",
)

TARGET_UNIT = """\
[Unit]
Description=heavylift test host (testbed.systemd_host)
Requires=basic.target
Wants={sshd_unit}
After=basic.target {sshd_unit}
AllowIsolate=yes
"""

SSHD_SERVICE = """\
[Unit]
Description=sshd of the heavylift test host
After=network.target

[Service]
ExecStart={sshd} -D -e -f /etc/heavylift-testbed/sshd_config
UMask={umask}
RuntimeDirectory=sshd
RuntimeDirectoryPreserve=yes
KillMode=process
"""

SSHD_CONFIG = """\
# sshd of systemd test host {name} (written by testbed.systemd_host)
Port {port}
ListenAddress 0.0.0.0
HostKey /etc/heavylift-testbed/ssh_host_ed25519_key
PidFile /run/sshd.pid
AuthorizedKeysFile /etc/heavylift-testbed/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
Subsystem sftp internal-sftp
{set_env}"""

# The launching shell: joins our cgroups (only itself: it is the process we started), then
# becomes `unshare`, whose child is the host's PID 1.
LAUNCH_SCRIPT = """\
#!/bin/sh
set -eu
for procs in {cgroup_procs}; do
    echo $$ > "$procs"
done
exec unshare --pid --fork --kill-child --mount --uts --cgroup --net --propagation private -- /bin/sh {boot}
"""

# PID 1 of the new namespaces until it execs systemd.
BOOT_SCRIPT = """\
#!/bin/sh
set -eu
host_dir={host_dir}
root="$host_dir/root"

hostname {name}
mount -t overlay overlay -o "lowerdir=/,upperdir=$host_dir/upper,workdir=$host_dir/work" "$root"

# a minimal /dev, as systemd-nspawn makes one: no disks, no terminals of the machine
mount -t tmpfs -o mode=755,nosuid tmpfs "$root/dev"
for node in null zero full random urandom tty; do
    touch "$root/dev/$node"
    mount --bind "/dev/$node" "$root/dev/$node"
done
# systemd writes its boot messages to the console: into this host's console.log
touch "$root/dev/console"
mount --bind "$host_dir/console.log" "$root/dev/console"
mkdir "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"

mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
# kernel-wide settings stay the machine's: /proc/sys and sysrq read-only (as nspawn does)
mount --bind "$root/proc/sys" "$root/proc/sys"
mount -o remount,bind,ro "$root/proc/sys"
if [ -e "$root/proc/sysrq-trigger" ]; then
    mount --bind "$root/proc/sysrq-trigger" "$root/proc/sysrq-trigger"
    mount -o remount,bind,ro "$root/proc/sysrq-trigger"
fi
# sysfs of this network namespace, read-only; cgroup2 rooted at our cgroup (cgroup namespace)
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$root/sys/fs/cgroup"
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$root/run"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/tmp"

# sshd without PAM refuses keys for a locked account ("!" in shadow): unlock root, in this host
if grep -q '^root:!' "$root/etc/shadow"; then
    sed -i 's/^root:[^:]*:/root:*:/' "$root/etc/shadow"
fi

cd "$root"
mkdir -p .testbed-oldroot
pivot_root . .testbed-oldroot
cd /
umount -l /.testbed-oldroot
rmdir /.testbed-oldroot

exec setpriv --bounding-set {dropped} -- \\
    env -i container={container} PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    {systemd} --system --unit={target} --show-status=no
"""


# Cgroups


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy and where a process sits in it."""

    mountpoint: str
    path: str  # the process's cgroup, relative to the hierarchy's root

    @property
    def folder(self) -> Path:
        return Path(self.mountpoint) / self.path.lstrip("/")


def cgroup_memberships(pid: int | str = "self") -> dict[str, str]:
    """``/proc/PID/cgroup`` as {controllers: path}; "" is the cgroup2 hierarchy."""
    memberships = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        memberships[controllers] = path
    return memberships


def mounted_hierarchies() -> list[Hierarchy]:
    """Every cgroup hierarchy this machine mounts, with the test runner's own cgroup in it."""
    own = cgroup_memberships()
    hierarchies = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        fstype, super_options = fields[separator + 1], fields[separator + 3]
        mount_root, mountpoint = fields[3], fields[4]
        if fstype == "cgroup2":
            key = ""
        elif fstype == "cgroup":
            options = set(super_options.split(","))
            key = next((k for k in own if k and set(k.split(",")) <= options), None)
            if key is None:
                continue
        else:
            continue
        if key not in own:
            continue
        relative = os.path.relpath(own[key], mount_root) if mount_root != "/" else own[key]
        if relative.startswith(".."):
            continue  # the runner's cgroup is outside this mount's view
        hierarchies.append(Hierarchy(mountpoint, relative))
    return hierarchies


def machine_cgroups() -> dict[str, dict[str, str]]:
    """What must never change while a systemd test host runs: PID 1's and the runner's cgroups."""
    return {"pid 1": cgroup_memberships(1), "runner": cgroup_memberships()}


def check_machine_cgroups(before: dict[str, dict[str, str]]) -> None:
    after = machine_cgroups()
    if after != before:
        raise RuntimeError(
            "A systemd test host changed this machine's cgroups (never to happen, see docs/testing.md):\n"
            f"before: {before}\nafter: {after}"
        )


def create_cgroups(name: str) -> list[Path]:
    folders = []
    try:
        for hierarchy in mounted_hierarchies():
            folder = hierarchy.folder / name
            folder.mkdir()
            folders.append(folder)
            # a cpuset cgroup takes no process before it has CPUs and memory nodes: the parent's
            for setting in ("cpuset.cpus", "cpuset.mems"):
                if (folder / setting).exists():
                    (folder / setting).write_text((hierarchy.folder / setting).read_text())
    except BaseException:
        remove_cgroups(folders, timeout=0)
        raise
    return folders


def cgroup_processes(folder: Path) -> list[int]:
    pids = []
    for procs in folder.rglob("cgroup.procs"):
        try:
            pids += [int(pid) for pid in procs.read_text().split()]
        except OSError:
            pass
    return pids


def remove_cgroups(folders: Sequence[Path], timeout: float = 10) -> None:
    """Remove our cgroups and every cgroup systemd made below them, once no process is left."""
    deadline = time.monotonic() + timeout
    for folder in folders:
        while folder.exists() and cgroup_processes(folder) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not folder.exists():
            continue
        # deepest first: a cgroup goes only when it has no children
        for child in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            child.rmdir()
        folder.rmdir()


# Network


def used_networks() -> list[ipaddress.IPv4Network]:
    output = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return [ipaddress.ip_interface(line.split()[3]).network for line in output.splitlines()]


def free_subnet() -> ipaddress.IPv4Network:
    """A /30 of 10.213.0.0/16 that no interface of this machine is on."""
    used = used_networks()
    for subnet in NETWORK.subnets(new_prefix=30):
        if not any(subnet.overlaps(other) for other in used):
            return subnet
    raise RuntimeError(f"no free /30 left in {NETWORK}")


def child_pids(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@dataclass
class SystemdHost:
    """One test host with systemd as PID 1. Paths are as seen from outside the host."""

    __test__ = False  # not a pytest test class

    base_dir: Path
    name: str
    environment: dict[str, str] = field(default_factory=dict)  # set in every SSH session (sshd SetEnv)
    # the umask of every SSH session (sshd's own, UsePAM no): 0077 for a hardened host
    umask: str = "0022"
    pid: int = 0  # the host's PID 1 (systemd), as this machine numbers it
    subnet: ipaddress.IPv4Network | None = None
    _launcher: subprocess.Popen | None = field(default=None, repr=False)
    _cgroups: list[Path] = field(default_factory=list, repr=False)
    _machine_cgroups: dict | None = field(default=None, repr=False)

    def __post_init__(self):
        if not HOST_NAME_PATTERN.match(self.name):
            raise ValueError(f"{self.name!r} is not a usable host name (a-z, 0-9, -)")
        if not re.fullmatch(r"0?[0-7]{3}", self.umask):
            raise ValueError(f"umask {self.umask!r} is not an octal mode such as 0022 or 0077")
        self.base_dir = Path(self.base_dir).resolve()
        check_base_dir(self.base_dir)
        self.dir = self.base_dir / self.name
        self.cgroup_name = f"heavylift-testbed-{self.name}-{secrets.token_hex(4)}"

    # Where things are

    @property
    def address(self) -> str:
        """The host's own address (its sshd, and vLLM when bound to it)."""
        return str(self.subnet[2])

    @property
    def gateway(self) -> str:
        """This machine's address on the host's link: bind a service here for the host to reach it."""
        return str(self.subnet[1])

    @property
    def interface(self) -> str:
        return f"hlsd{self.subnet.network_address.packed[2]}x{self.subnet.network_address.packed[3]}"

    @property
    def key(self) -> str:
        return str(self.dir / "client_key")

    @property
    def upper(self) -> Path:
        return self.dir / "upper"

    def path(self, host_path: str) -> Path:
        """Outside path of a file the host wrote (only files it wrote or changed are there)."""
        return self.upper / host_path.lstrip("/")

    def view(self, host_path: str) -> Path:
        """Outside path of any file as the host sees it, while it runs."""
        return Path(f"/proc/{self.pid}/root") / host_path.lstrip("/")

    def inventory_entry(self, **data: Any) -> tuple[str, dict[str, Any]]:
        connection = {
            "ssh_hostname": self.address,
            "ssh_port": SSH_PORT,
            "ssh_user": "root",
            "ssh_key": self.key,
            "ssh_known_hosts_file": "/dev/null",
            "ssh_strict_host_key_checking": "off",
        }
        return self.name, {**connection, **data}

    def write_inventory(self, path: str | os.PathLike, data: dict[str, Any] | None = None) -> Path:
        entries = [self.inventory_entry(**(data or {}))]
        path = Path(path)
        path.write_text(
            f"# systemd test host {self.name} under {self.base_dir}; written by testbed.systemd_host\n\n"
            f"all = {pformat(entries, sort_dicts=False)}\n"
        )
        return path

    def run(self, command: str | Sequence[str], check: bool = False, timeout: float | None = 60) -> subprocess.CompletedProcess:
        """Run a command inside the host (all its namespaces and its root), without SSH."""
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        return subprocess.run(
            ["nsenter", "--target", str(self.pid), "--all", "--root", "--wd", "--", *argv],
            env=HOST_ENV, capture_output=True, text=True, check=check, timeout=timeout,
        )

    def console(self) -> str:
        try:
            return (self.dir / "console.log").read_text(errors="replace")
        except OSError:
            return "(no console log)"

    # Starting

    def start(self, timeout: float = 60) -> Self:
        ensure_root()
        ensure_openssh()
        if not Path(SYSTEMD).exists():
            raise RuntimeError(f"{SYSTEMD} is missing: install Debian's systemd package")
        self._machine_cgroups = machine_cgroups()
        self.dir.mkdir(parents=True)  # fails if it exists: another host's, never to be touched
        try:
            self._prepare()
            self._cgroups = create_cgroups(self.cgroup_name)
            self._launch()
            self._connect_network()
            self._wait_until_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _prepare(self) -> None:
        for folder in ("upper", "work", "root"):
            (self.dir / folder).mkdir()
        (self.dir / "console.log").touch()
        etc = self.upper / "etc"
        units = etc / "systemd" / "system"
        units.mkdir(parents=True)
        for unit in MASKED_UNITS:
            (units / unit).symlink_to("/dev/null")
        (units / TARGET).write_text(TARGET_UNIT.format(sshd_unit=SSHD_UNIT))
        (units / SSHD_UNIT).write_text(SSHD_SERVICE.format(sshd=SSHD, umask=self.umask))
        # a machine id of its own (journal folders, D-Bus), and no mounts from the machine's fstab
        (etc / "machine-id").write_text(secrets.token_hex(16) + "\n")
        (etc / "fstab").write_text("# systemd test host: nothing to mount\n")
        (etc / "hostname").write_text(self.name + "\n")
        config = etc / "heavylift-testbed"
        config.mkdir()
        generate_ssh_key(config / "ssh_host_ed25519_key", f"testbed-{self.name}-host")
        generate_ssh_key(self.dir / "client_key", f"testbed-{self.name}-client")
        shutil.copy(self.dir / "client_key.pub", config / "authorized_keys")
        set_env = "".join(f"SetEnv {key}={shlex.quote(value)}\n" for key, value in self.environment.items())
        (config / "sshd_config").write_text(SSHD_CONFIG.format(name=self.name, port=SSH_PORT, set_env=set_env))
        (self.dir / "boot.sh").write_text(BOOT_SCRIPT.format(
            host_dir=shlex.quote(str(self.dir)), name=shlex.quote(self.name),
            dropped=",".join(f"-{cap}" for cap in DROPPED_CAPABILITIES),
            container=CONTAINER_NAME, systemd=SYSTEMD, target=TARGET,
        ))

    def _launch(self) -> None:
        procs = " ".join(shlex.quote(str(folder / "cgroup.procs")) for folder in self._cgroups)
        (self.dir / "launch.sh").write_text(LAUNCH_SCRIPT.format(cgroup_procs=procs, boot=shlex.quote(str(self.dir / "boot.sh"))))
        with open(self.dir / "boot.log", "wb") as log:
            self._launcher = subprocess.Popen(
                ["/bin/sh", str(self.dir / "launch.sh")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the terminal is for pytest; stop() takes the host down
            )
        deadline = time.monotonic() + 10
        while not self.pid:
            if self._launcher.poll() is not None:
                raise RuntimeError(f"systemd test host {self.name} did not start:\n{self.boot_log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"systemd test host {self.name}: unshare made no child\n{self.boot_log()}")
            children = child_pids(self._launcher.pid)
            # the launcher is `unshare` once its child exists (it forks only after the exec)
            if children and Path(f"/proc/{self._launcher.pid}/comm").read_text().strip() == "unshare":
                self.pid = children[0]
            else:
                time.sleep(0.01)
        self._save_state()

    def _connect_network(self) -> None:
        self.subnet = free_subnet()
        prefix = self.subnet.prefixlen
        commands = [
            ["ip", "link", "add", self.interface, "type", "veth", "peer", "name", "eth0", "netns", str(self.pid)],
            ["ip", "addr", "add", f"{self.gateway}/{prefix}", "dev", self.interface],
            ["ip", "link", "set", self.interface, "up"],
            ["nsenter", "--target", str(self.pid), "--net", "ip", "addr", "add", f"{self.address}/{prefix}", "dev", "eth0"],
            ["nsenter", "--target", str(self.pid), "--net", "ip", "link", "set", "eth0", "up"],
            ["nsenter", "--target", str(self.pid), "--net", "ip", "link", "set", "lo", "up"],
        ]
        for argv in commands:
            subprocess.run(argv, check=True, capture_output=True, text=True)
        self._save_state()

    def _wait_until_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            if self._launcher.poll() is not None:
                raise RuntimeError(f"systemd test host {self.name} stopped while booting:\n{self.boot_log()}\n{self.console()}")
            state = self.run("systemctl is-system-running 2>/dev/null || true", timeout=10).stdout.strip()
            if state in ("running", "degraded") and self._ssh_answers():
                if state == "degraded":
                    failed = self.run("systemctl --failed --no-legend --plain", timeout=10).stdout
                    raise RuntimeError(f"systemd test host {self.name} booted degraded; failed units:\n{failed}")
                return
            time.sleep(0.1)
        raise RuntimeError(f"systemd test host {self.name}: not running after {timeout} s (state {state!r})\n{self.console()}")

    def _ssh_answers(self) -> bool:
        result = subprocess.run(self.ssh_argv("true"), capture_output=True, timeout=30)
        return result.returncode == 0

    def ssh_argv(self, command: str) -> list[str]:
        return [
            "ssh", "-p", str(SSH_PORT), "-i", self.key,
            "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5",
            f"root@{self.address}", command,
        ]

    def boot_log(self) -> str:
        try:
            return (self.dir / "boot.log").read_text(errors="replace")
        except OSError:
            return "(no boot log)"

    def _save_state(self) -> None:
        state = {"name": self.name, "pid": self.pid, "subnet": str(self.subnet) if self.subnet else None,
                 "cgroups": [str(folder) for folder in self._cgroups]}
        (self.dir / "host.json").write_text(json.dumps(state, indent=2) + "\n")

    # Stopping

    def stop(self, timeout: float = 90, remove: bool = True) -> None:
        """systemd's poweroff signal; SIGKILL of the host's PID 1 after `timeout` s; our cgroups removed. Idempotent."""
        try:
            if self.pid and self._launcher is not None and self._launcher.poll() is None:
                # SIGRTMIN+4 is systemd's own "power off" signal (systemd(1), Signals): no D-Bus or
                # logind needed (both are masked here); every unit is stopped as on a real shutdown
                os.kill(self.pid, signal.SIGRTMIN + 4)
                try:
                    self._launcher.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    pass
            if self._launcher is not None and self._launcher.poll() is None:
                # the host's PID 1 dying takes every process of its PID namespace with it
                if self.pid:
                    os.kill(self.pid, signal.SIGKILL)
                else:
                    os.killpg(self._launcher.pid, signal.SIGKILL)
                self._launcher.wait(timeout=30)
            remove_cgroups(self._cgroups)
            self._cgroups = []
        finally:
            if self._machine_cgroups is not None:
                check_machine_cgroups(self._machine_cgroups)
        self.pid = 0
        if remove and self.dir.exists():
            shutil.rmtree(self.dir)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m testbed.systemd_host", description="Boot a systemd test host, print how to reach it, stop it on Enter.")
    parser.add_argument("--base", required=True, help="directory for the host's files (not tmpfs)")
    parser.add_argument("--name", default="sd1")
    args = parser.parse_args(argv)
    Path(args.base).mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with SystemdHost(Path(args.base), args.name) as host:
        print(f"{host.name}: running after {time.monotonic() - started:.1f} s, PID 1 is {host.pid}")
        print(f"  {shlex.join(host.ssh_argv('systemctl status'))}")
        input("Enter stops it: ")


if __name__ == "__main__":
    main(sys.argv[1:])
