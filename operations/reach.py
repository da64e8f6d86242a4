"""Hosts a run could not reach, named as the run's last words.

pyinfra 3.10 connects to every host before it reads a deploy file (pyinfra_cli/cli.py ``_main``:
``connect_all``, then the deploy). A host that does not answer is logged once among the connect
lines (``[gpu1] Could not connect (...)``, api/host.py ``Host.connect``) and dropped; when no host is
left the run ends with ``pyinfra error: No hosts remaining!``, and when some are left their run goes
on, so the line that said which host and why is far above the end, or the last line is a generic
one. deploy.py never runs for such a host, so only pyinfra's own callbacks can say it: ``config.py``
(which pyinfra executes before it connects) registers ``Unreachable``, which says at the end of the
run which hosts were not reached, how pyinfra tried, why, and that nothing was read or changed there.
"""

from __future__ import annotations

import atexit
import sys

from pyinfra.api.state import BaseStateCallback

FIX = ("Fix: check that the host is up and reachable from this machine and that its SSH server answers at that "
       "address and port (ssh_hostname, ssh_port in the inventory), then run again.")


def how_pyinfra_connects(host) -> str:
    if host.connector_cls.__name__ == "SSHConnector":
        return f"SSH to {host.data.get('ssh_hostname') or host.name} port {host.data.get('ssh_port') or 22}"
    return f"pyinfra's {host.connector_cls.__name__}"


class Unreachable(BaseStateCallback):
    """Every host pyinfra could not connect to in this run, with the connector's reason."""

    def __init__(self):
        # host name -> (how pyinfra tried, why it failed, whether the host had been reached before)
        self.hosts: dict[str, tuple[str, str, bool]] = {}

    # pyinfra's callback (api/state.py BaseStateCallback): the first connect, or a reconnect later in the run
    def host_connect_error(self, state, host, error):
        why = str(error.args[0]) if getattr(error, "args", None) else str(error)
        self.hosts[host.name] = (how_pyinfra_connects(host), why, host in state.activated_hosts)

    def lines(self, state) -> list[str]:
        lines = []
        for name, (how, why, lost) in sorted(self.hosts.items()):
            what = ("lost its connection: the run stopped on it where the output above shows" if lost
                    else "nothing was read from it or changed on it")
            lines.append(f"--> heavylift: host {name!r} could not be reached ({how}: {why}); {what}")
        if lines:
            reached = sorted(h.name for h in state.activated_hosts if h.name not in self.hosts)
            lines.append(f"    {'The run went on with ' + ', '.join(reached) if reached else 'No host was reached'}. {FIX}")
        return lines

    def report(self, state, out=None) -> None:
        for line in self.lines(state):
            print(line, file=out or sys.stderr)


def report_unreachable(state) -> Unreachable:
    """Registers the callback on this run's state (pyinfra's ``ctx_state``); what it found is printed as
    the run exits, after pyinfra's own last line.

    pyinfra 3.10 executes config.py before ``State.init``, which starts the run's list of callback
    handlers afresh (api/state.py), and connects right after it: the handler joins as ``init`` ends.
    """
    handler = Unreachable()
    init = state.init

    def init_then_register(*args, **kwargs):
        init(*args, **kwargs)
        state.add_callback_handler(handler)

    state.init = init_then_register
    atexit.register(handler.report, state)
    return handler
