"""Neighbours on one host: what the other heavylift deployments under the same root run, and the ports in use.

A host may run several deployments, each on its own port and its own GPUs. What the other deployments use is
read from the host itself, from each one's launcher (``<root>/deployments/<name>/serve`` and the one of the
release it runs, ``<name>/current/serve``), and the ports listened on from ``/proc/net/tcp`` and ``tcp6``.
Whether this deployment fits beside them is resolve/neighbours.py's to decide.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand

from resolve.layout import Layout


class HostNeighbours(FactBase):
    """Each deployment's launcher under ``deployments_dir`` and the TCP ports listened on.

    Returns {"launchers": {"<name>/serve" or "<name>/current/serve": text}, "listening": [port, ...]}.
    """

    def command(self, deployments_dir):
        folder = QuoteString(deployments_dir)
        # <name>/serve: the launcher of the last run; <name>/current/serve: the release vLLM runs now
        loop = (
            'for f in "$0"/*/serve "$0"/*/current/serve; do [ -f "$f" ] || continue; '
            'printf "### %s\\n" "${f#"$0"/}"; cat "$f"; echo; done; '
            'echo "### /proc/net/tcp"; cat /proc/net/tcp /proc/net/tcp6 2>/dev/null; true'
        )
        return StringCommand("sh", "-c", QuoteString(loop), folder)

    def default(self):
        return {"launchers": {}, "listening": []}

    def process(self, output):
        sections: dict[str, list[str]] = {}
        current = None
        for line in output:
            if line.startswith("### "):
                current = line[4:]
                sections[current] = []
            elif current is not None:
                sections[current].append(line)
        listening = set()
        for line in sections.pop("/proc/net/tcp", []):
            fields = line.split()
            # sl local_address rem_address st ...: state 0A is LISTEN (include/net/tcp_states.h)
            if len(fields) > 3 and fields[3] == "0A" and ":" in fields[1]:
                listening.add(int(fields[1].rsplit(":", 1)[1], 16))
        return {"launchers": {name: "\n".join(lines) for name, lines in sections.items()}, "listening": sorted(listening)}


def read(root: str | None) -> dict:
    """What the host under ``root`` runs: the ``HostNeighbours`` of its deployments folder."""
    return host.get_fact(HostNeighbours, deployments_dir=Layout.of_host(root).deployments_dir)
