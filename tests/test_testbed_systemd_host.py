"""The systemd test host itself: systemd is PID 1 of its own namespaces, reached over real SSH,
kept in a cgroup of ours, and gone without a trace when stopped (docs/testing.md, "A real systemd for tests")."""

import os
import subprocess

import pytest

from testbed.systemd_host import SystemdHost, cgroup_processes, machine_cgroups

pytestmark = pytest.mark.e2e


@pytest.fixture
def host(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("a systemd test host needs root (namespaces, cgroups, overlay mounts)")
    before = machine_cgroups()
    # a hardened host's umask: what the rollout e2e runs under too
    started = SystemdHost(tmp_path, "sdcheck", umask="0077").start()
    try:
        yield started
    finally:
        started.stop()
    assert machine_cgroups() == before


def test_systemd_is_pid_1_of_its_own_namespaces_and_reachable_by_ssh(host):
    assert host.run(["systemctl", "is-system-running"]).stdout.strip() == "running"
    assert host.run(["cat", "/proc/1/comm"]).stdout.strip() == "systemd"
    assert host.run(["systemd-detect-virt", "--container"]).stdout.strip() != "none"
    # its cgroup tree is the subtree we made: "/" inside is our folder outside
    assert host.run(["cat", "/proc/1/cgroup"]).stdout.strip().endswith("::/init.scope")
    # real SSH over its own link, to the host's own sshd
    over_ssh = subprocess.run(host.ssh_argv("hostname; systemctl show -p MainPID --value heavylift-testbed-sshd"),
                              capture_output=True, text=True, timeout=60)
    assert over_ssh.returncode == 0, over_ssh.stderr
    assert over_ssh.stdout.split()[0] == "sdcheck"
    # SSH sessions get the host's umask, as pam_umask or login.defs would give them
    umask = subprocess.run(host.ssh_argv("umask"), capture_output=True, text=True, timeout=60)
    assert umask.stdout.strip() == "0077", umask
    # no route out: only the link to this machine
    routes = host.run(["ip", "-4", "route"]).stdout
    assert "default" not in routes and host.address in routes, routes


def test_stop_powers_off_and_leaves_no_process_and_no_cgroup(host):
    folders = list(host._cgroups)
    assert folders and all(folder.is_dir() for folder in folders)
    assert any(cgroup_processes(folder) for folder in folders)
    writes = host.path("/etc/heavylift-was-here")
    host.run(["touch", "/etc/heavylift-was-here"], check=True)
    assert writes.exists() and not os.path.exists("/etc/heavylift-was-here")  # copy-on-write root
    pid = host.pid
    host.stop(remove=False)
    assert not os.path.exists(f"/proc/{pid}")
    assert not any(folder.exists() for folder in folders)
