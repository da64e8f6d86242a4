"""The supervisor choice (resolve/supervisor.py): made once, while planning; the plan carries systemd or fallback."""

import pytest

from resolve import supervisor


@pytest.mark.parametrize(("setting", "init_system", "expected"), [
    ("auto", "systemd", "systemd"),
    ("auto", "none", "fallback"),
    ("auto", None, "fallback"),  # not read: a host whose init system is unknown gets the fallback
    ("systemd", "none", "systemd"),  # the site's word, even where systemd does not run (the unit waits for it)
    ("fallback", "systemd", "fallback"),
    ("systemd", None, "systemd"),
])
def test_the_site_decides_and_auto_asks_the_host(setting, init_system, expected):
    assert supervisor.decided(setting, init_system) == expected
    assert supervisor.asks_host(setting) == (setting == "auto")
