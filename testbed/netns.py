"""
A private network for SSH test hosts: a bridge in a network namespace of its own (the "switch"),
and one network namespace per host joined to it by a veth pair.

    with BridgeNetwork.create() as net:          # 10.200.0.0/24, the switch on 10.200.0.1
        ns, address = net.add_host("node0")      # /run/netns/<prefix>-node0, 10.200.0.11
        subprocess.run(net.argv(["ssh", f"root@{address}", "hostname"]))

Nothing is added to the machine's own network namespace: the bridge, its address and every
host address live in namespaces this module made, so the same /24 can be in use by another bed
at the same time. What runs "on the control side" (pyinfra, a Hub mirror the hosts download
from) runs in the switch namespace through `argv()` (`nsenter --net=...`).

Hosts get no default route: a program that guesses its address from the route towards a public
IP (vLLM's `get_ip()`) must be told it, as on an isolated cluster network.

`destroy()` deletes every namespace it made (the kernel then removes the bridge and the veths
with them). It is idempotent and writes what it made to a state file first, so `forget()` from
another process (the CLI's `down`) can clean up after a crash.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

NETNS_DIR = Path("/run/netns")  # where `ip netns add` pins a namespace
DEFAULT_SUBNET = "10.200.0.0/24"
SWITCH_HOST = 1  # the switch's address in the subnet (.1); hosts get .11, .12, ...
FIRST_HOST = 11
BRIDGE = "br0"
HOST_INTERFACE = "eth0"
STATE_FILE = "network.json"
NAME_PATTERN = re.compile(r"^[a-z0-9-]{1,40}$")


def ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"`ip {shlex.join(args)}` failed: {result.stderr.strip()}")


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


@dataclass
class BridgeNetwork:
    """One bridge in a switch namespace, and the host namespaces attached to it."""

    prefix: str  # every namespace this network makes is named "<prefix>-..."
    subnet: ipaddress.IPv4Network
    state_path: Path | None = None
    hosts: dict[str, str] = field(default_factory=dict)  # host name -> its address
    namespaces: list[str] = field(default_factory=list)  # made by us, in creation order

    @classmethod
    def create(cls, subnet: str = DEFAULT_SUBNET, state_path: Path | None = None) -> Self:
        # a short unique prefix: namespace names of beds running side by side never collide
        net = cls(prefix=f"hl{uuid.uuid4().hex[:8]}", subnet=ipaddress.IPv4Network(subnet), state_path=state_path)
        try:
            net._make_namespace(net.switch_namespace)
            ip("-n", net.switch_namespace, "link", "set", "lo", "up")
            ip("-n", net.switch_namespace, "link", "add", BRIDGE, "type", "bridge")
            ip("-n", net.switch_namespace, "addr", "add", f"{net.switch_address}/{net.subnet.prefixlen}", "dev", BRIDGE)
            ip("-n", net.switch_namespace, "link", "set", BRIDGE, "up")
        except BaseException:
            net.destroy()
            raise
        return net

    @property
    def switch_namespace(self) -> str:
        return f"{self.prefix}-switch"

    @property
    def switch_path(self) -> str:
        return str(NETNS_DIR / self.switch_namespace)

    @property
    def switch_address(self) -> str:
        """The control side's address on the bridge: bind a Hub mirror here."""
        return str(self.subnet[SWITCH_HOST])

    def host_namespace(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def host_path(self, name: str) -> str:
        return str(NETNS_DIR / self.host_namespace(name))

    def add_host(self, name: str) -> tuple[str, str]:
        """A namespace for host `name` on the bridge: (its /run/netns path, its address)."""
        if not NAME_PATTERN.match(name):
            raise ValueError(f"{name!r} is not a usable host name for a namespace (a-z, 0-9, -)")
        if name in self.hosts:
            raise ValueError(f"host {name!r} is on this network already")
        index = len(self.hosts)
        address = str(self.subnet[FIRST_HOST + index])
        namespace = self.host_namespace(name)
        switch_side = f"veth{index}"  # interface names are at most 15 characters
        self._make_namespace(namespace)
        ip("-n", self.switch_namespace, "link", "add", switch_side, "type", "veth",
           "peer", "name", HOST_INTERFACE, "netns", namespace)  # fmt: skip
        ip("-n", self.switch_namespace, "link", "set", switch_side, "master", BRIDGE, "up")
        ip("-n", namespace, "link", "set", "lo", "up")
        ip("-n", namespace, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", HOST_INTERFACE)
        ip("-n", namespace, "link", "set", HOST_INTERFACE, "up")
        self.hosts[name] = address
        self.save()
        return self.host_path(name), address

    def argv(self, argv: list[str]) -> list[str]:
        """`argv` run on the control side: in the switch namespace, where every host is reachable."""
        return ["nsenter", f"--net={self.switch_path}", "--", *argv]

    def _make_namespace(self, name: str) -> None:
        if netns_exists(name):
            raise RuntimeError(f"network namespace {name} exists already: not ours, left alone")
        self.namespaces.append(name)  # before `ip`: a half-made one is still removed
        self.save()
        ip("netns", "add", name)

    # Stopping

    def save(self) -> None:
        if self.state_path is None:
            return
        state = {"prefix": self.prefix, "subnet": str(self.subnet), "hosts": self.hosts, "namespaces": self.namespaces}
        self.state_path.write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def load(cls, state_path: Path) -> Self:
        state = json.loads(state_path.read_text())
        return cls(
            prefix=state["prefix"],
            subnet=ipaddress.IPv4Network(state["subnet"]),
            state_path=state_path,
            hosts=state["hosts"],
            namespaces=state["namespaces"],
        )

    def destroy(self) -> None:
        """Delete every namespace made here, hosts first; the bridge and veths go with them.

        Call it once the processes inside have stopped: a namespace with processes in it lives
        on, unnamed, until they end."""
        errors = []
        for name in reversed(self.namespaces):
            if not name.startswith(f"{self.prefix}-"):
                continue  # never anything this network did not name
            if netns_exists(name):
                try:
                    ip("netns", "delete", name)
                except RuntimeError as error:
                    errors.append(error)
        self.namespaces = [name for name in self.namespaces if netns_exists(name)]
        self.hosts = {}
        if self.state_path is not None:
            if self.namespaces:
                self.save()
            else:
                self.state_path.unlink(missing_ok=True)
        if errors:
            raise errors[0]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.destroy()


def leftover_namespaces(prefix: str) -> list[str]:
    """Named network namespaces starting with `prefix` (for tests that check the cleanup)."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(entry for entry in os.listdir(NETNS_DIR) if entry.startswith(prefix))
