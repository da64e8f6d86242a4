"""Addresses in URLs: how heavylift reaches a server from its bind address.

Standard library only; the host scripts (operations/scripts/host_state.py) keep their own copy of
``url_host`` because they run on the host with no heavylift package there.
"""

from __future__ import annotations

# addresses a server listens on for every interface (and the loopback itself): the host reaches it
# on 127.0.0.1 (Linux listens on both families on "::" unless net.ipv6.bindv6only is set)
REACH_ON_LOOPBACK = ("0.0.0.0", "::", "127.0.0.1")
WILDCARDS = ("0.0.0.0", "::")


def url_host(address: str) -> str:
    """``address`` as the host part of a URL: an IPv6 literal in brackets (RFC 3986 section 3.2.2:
    ``http://[::1]:8000``, never ``http://::1:8000``), a name or an IPv4 address as it is."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def local_url(bind_address: str, port: int) -> str:
    """The server bound to ``bind_address`` as its own host reaches it."""
    host = "127.0.0.1" if bind_address in REACH_ON_LOOPBACK else bind_address
    return f"http://{url_host(host)}:{port}"


def public_url(bind_address: str, port: int, host_name: str) -> str:
    """The server as others reach it: the host's name when it listens everywhere."""
    return f"http://{url_host(host_name if bind_address in WILDCARDS else bind_address)}:{port}"
