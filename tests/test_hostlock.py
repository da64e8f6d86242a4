"""operations/hostlock.py, without a host: what a failed host's lock release does when the failure was the
connection itself (the e2e of a host cut off mid-wave is tests/test_e2e_waves.py)."""

import logging

import pytest
from paramiko import SSHException

from operations.hostlock import _ReleaseOnFailure


class CutOffHost:
    name = "host2"
    print_prefix = "[host2] "

    def __init__(self, error):
        self.error = error
        self.commands = []

    def run_shell_command(self, command):
        self.commands.append(command)
        raise self.error


@pytest.mark.parametrize("error", [SSHException("SSH session not active"), ConnectionResetError(104, "reset"), EOFError()])
def test_a_lock_that_cannot_be_given_back_over_a_dead_connection_is_said_not_raised(error, caplog):
    handler = _ReleaseOnFailure()
    handler.paths["host2"] = "/opt/heavylift/deploy.lock"
    host = CutOffHost(error)
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        handler.operation_host_error(None, host, "op")  # raised, it would end the whole run at once
    assert len(host.commands) == 1 and "host2" not in handler.paths
    assert "deploy lock not given back" in caplog.text and "recovers the lock as stale" in caplog.text


def test_a_host_without_a_lock_of_this_run_is_left_alone():
    host = CutOffHost(SSHException("never called"))
    _ReleaseOnFailure().operation_host_error(None, host, "op")
    assert host.commands == []
