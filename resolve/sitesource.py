"""The site source's part of a host's plan: does this host fetch from the Hub and serve, or copy from the source?

operations/sitesource.py runs it (the server on the source host, the copy on the others).
"""

from __future__ import annotations

from dataclasses import dataclass

from .address import url_host


@dataclass(frozen=True)
class SourcePlan:
    """What one host does with the site source: ``source`` fetches from the Hub and serves, ``peer`` copies."""

    host: str  # the source host's inventory name
    role: str  # "source" or "peer"
    url: str  # how the other hosts reach the source's server
    port: int
    bind_address: str
    wait_seconds: int

    @property
    def fills_from_hub(self) -> bool:
        return self.role == "source"


def plan_for(settings, host_name: str, ssh_hostname_of) -> SourcePlan | None:
    """The host's part of the site source (None: the site has none; every host fetches from the Hub).

    + ssh_hostname_of: inventory name -> the ssh_hostname pyinfra reaches that host by (None: unknown or unset)
    """
    wanted = settings.site_source
    if wanted is None:
        return None
    # the address pyinfra itself reaches the source by: its ssh_hostname, else its inventory name
    address = wanted.address or ssh_hostname_of(wanted.host) or wanted.host
    return SourcePlan(
        host=wanted.host, role="source" if host_name == wanted.host else "peer",
        url=f"http://{url_host(address)}:{wanted.port}", port=wanted.port, bind_address=wanted.bind_address,
        wait_seconds=wanted.wait_seconds,
    )
