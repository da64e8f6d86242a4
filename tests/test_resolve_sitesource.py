"""resolve/sitesource.py: each host's part of the site source, from the site's setting and how pyinfra reaches
the source host."""

from types import SimpleNamespace

import pytest

from models.schema import SiteSource
from resolve.sitesource import plan_for


def settings(**site_source):
    return SimpleNamespace(site_source=SiteSource(**site_source) if site_source else None)


def test_a_site_without_a_source_plans_none():
    assert plan_for(settings(), "gpu1", lambda name: None) is None


def test_the_source_fetches_from_the_hub_and_the_others_copy_from_it():
    site = settings(host="gpu1", port=8391)
    reached = {"gpu1": "10.0.0.11"}.get
    source, peer = plan_for(site, "gpu1", reached), plan_for(site, "gpu2", reached)
    assert (source.role, source.fills_from_hub) == ("source", True)
    assert (peer.role, peer.fills_from_hub) == ("peer", False)
    # both name the server as the peers reach it: by pyinfra's own address of the source host
    assert source.url == peer.url == "http://10.0.0.11:8391"
    assert (peer.host, peer.bind_address, peer.wait_seconds) == ("gpu1", "0.0.0.0", 60)


@pytest.mark.parametrize("setting, ssh_hostname, url", [
    ({"address": "fd00::11"}, "10.0.0.11", "http://[fd00::11]:8391"),  # the site's address wins, IPv6 in brackets
    ({}, None, "http://gpu1:8391"),  # no ssh_hostname: the inventory name
    ({}, "gpu1.lan", "http://gpu1.lan:8391"),
])
def test_the_url_the_peers_use(setting, ssh_hostname, url):
    assert plan_for(settings(host="gpu1", **setting), "gpu2", lambda name: ssh_hostname).url == url
