"""The tensor parallel preflights: /dev/shm, GPU memory other processes hold, the GPU topology, and the
site's NVLink multicast setting (docs/tp-preflights.md). The rules' both sides are in tests/test_compat.py."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from models.schema import NVLINK_MULTICAST_OFF, SiteSettings
from operations.gpu import NvidiaGpuUse, NvidiaTopology
from operations.shm import DevShm
from resolve.compat import Requested, resolve
from resolve.shm import MIB, ShmSpace
from test_compat import H200, H200_REAL, LLAMA8B, TOPO_NVLINK, TOPO_PCIE, gpu_use, on

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"


# ---------------------------------------------------------------- topology


def test_nvlink_box_every_pair_over_nv18():
    assert len(TOPO_NVLINK.links) == 8 * 7
    assert TOPO_NVLINK.between(range(8)) == {"NV18": [(a, b) for a in range(8) for b in range(a + 1, 8)]}
    assert TOPO_NVLINK.describe(range(8)) == "GPUs 0-7: NV18 (NVLink) between all 28 pairs"


def test_pcie_box_has_no_nvlink():
    kinds = TOPO_PCIE.between(range(8))
    assert {kind: len(pairs) for kind, pairs in kinds.items()} == {"PIX": 4, "NODE": 8, "SYS": 16}
    assert (0, 1) in kinds["PIX"] and (0, 4) in kinds["SYS"] and (0, 2) in kinds["NODE"]
    assert TOPO_PCIE.describe([0, 1]) == "GPUs 0, 1: PIX (PCIe, at most one bridge) between all 1 pairs"
    assert TOPO_PCIE.describe([0, 1, 2, 3]).startswith("GPUs 0-3: PIX (PCIe, at most one bridge) between 2 of 6 pairs; NODE")


def test_topology_without_nvidia_smi_or_matrix():
    assert NvidiaTopology().process(["absent"]).problem == "nvidia-smi is not installed"
    broken = NvidiaTopology().process(["Failed to initialize NVML: Driver/library version mismatch"])
    assert not broken.links and "NVML" in broken.problem


def test_topology_in_the_plan_says_pcie():
    gpus, resources = on(H200, None, topology=TOPO_PCIE)
    notes = resolve(gpus, LLAMA8B, "0.26.0", Requested(tensor_parallel_size=8), host=resources).notes
    note = next(n for n in notes if n.startswith("topology "))
    assert "no NVLink between 28 pair(s) (NODE, PIX, SYS)" in note and "/dev/shm" in note


# ---------------------------------------------------------------- GPU memory held by others


def test_gpu_use_attributes_memory_to_deployments():
    use = gpu_use("h200-x1-two-deployments")
    assert use.used_mib == {0: 124321} and use.total_mib == {0: 143771}
    assert [(p.pid, p.deployment, p.used_mib) for p in use.processes] == [(48213, "llama-8b", 80512), (51877, "mla", 43288)]
    assert use.others(0, "llama-8b")[0] == 43288
    assert use.others(0, "mla")[0] == 80512
    assert use.others(0, "third")[0] == 80512 + 43288
    assert gpu_use("container-processes-hidden").others(0, "x") == (0, ())


def test_refusal_names_gpu_numbers_pid_field_and_fix():
    gpus, resources = on(H200, deployment="dsv3-tp8", gpu_use=gpu_use("h200-x8-orphaned-rank"))
    refusal = resolve(gpus, LLAMA8B, "0.26.0", Requested(tensor_parallel_size=8), host=resources).refusal
    assert refusal.rule_id == "gpu-memory-used-by-others"
    assert refusal.message == (
        "GPU 3 (NVIDIA H200) has 120788 MiB of 143771 MiB held by other processes (pid 91234 (VLLM::Worker_TP3): "
        "120788 MiB); vLLM needs 132270 MiB free at start-up (--gpu-memory-utilization 0.92, vLLM's default; "
        "field 'extra_args') and would find 22983 MiB (GPUs short: 3)"
    )
    assert "nvidia-smi --query-compute-apps" in refusal.fix and "field 'gpus'" in refusal.fix
    assert "lower --gpu-memory-utilization in extra_args to 0.14 or less" in refusal.fix


def test_h200_site_shares_fit():
    """inventory/h200.py: llama-8b (0.55) and mla (0.3) on one H200, each re-run with the other serving."""
    for name, fraction in (("llama-8b", 0.55), ("mla", 0.3)):
        gpus, resources = on(H200_REAL, [0], name, gpu_use=gpu_use("h200-x1-two-deployments"))
        resolution = resolve(gpus, LLAMA8B, "0.26.0", Requested(gpu_memory_utilization=fraction), host=resources)
        assert resolution.ok, resolution.to_json()


# ---------------------------------------------------------------- /dev/shm


def test_shm_refusal_names_field_and_fix():
    gpus, resources = on(H200, shm=ShmSpace(size=64 * MIB, free=64 * MIB))
    refusal = resolve(gpus, LLAMA8B, "0.26.0", Requested(tensor_parallel_size=8), host=resources).refusal
    assert refusal.rule_id == "dev-shm-too-small"
    assert refusal.message.startswith("field 'tensor_parallel_size': 8 ranks on this host put 2.05 GiB into /dev/shm (")
    assert refusal.message.endswith("but /dev/shm holds 64 MiB in all")
    assert "docker run --shm-size=4g" in refusal.fix and "smaller tensor_parallel_size" in refusal.fix


# ---------------------------------------------------------------- the facts' real commands


def test_dev_shm_fact_on_this_machine(local_host):
    space = local_host.get_fact(DevShm)
    usage = shutil.disk_usage("/dev/shm")
    assert space.size == usage.total
    assert abs(space.free - usage.free) < 64 * MIB


def test_gpu_use_fact_names_the_deployment_of_a_process_and_its_children(local_host, tmp_path, monkeypatch):
    """A process started from <root>/deployments/<name>/ and its child belong to <name>, and so does a rank whose
    parents are gone but which runs from there (an orphan heavylift's run ends before the start); this test's own
    process to none; a pid not in /proc is '?'."""
    release = tmp_path / "deployments" / "tp2" / "releases" / "r1"
    release.mkdir(parents=True)
    (release / "serve").write_text("#!/bin/sh\nsleep 60 &\nwait\n")
    (release / "serve").chmod(0o755)
    server = subprocess.Popen([str(release / "serve")], start_new_session=True)
    # a rank whose API server is gone: no ancestor runs from the deployment, its working folder still does
    orphan = subprocess.Popen(["sleep", "60"], cwd=release, start_new_session=True)
    try:
        child = None
        for _ in range(50):
            found = subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True, text=True).stdout.split()
            if found:
                child = int(found[0])
                break
            time.sleep(0.1)
        assert child
        uuid = "GPU-3f2c9a1e-7b44-5d0e-9c1a-2e8f6b0d4a71"
        fake = tmp_path / "bin"
        fake.mkdir()
        (fake / "nvidia-smi").write_text(
            "#!/bin/sh\ncase \"$1\" in\n"
            f"  --query-gpu=*) echo '0, {uuid}, 1500, 143771';;\n"
            f"  --query-compute-apps=*) echo '{uuid}, {child}, 1000, VLLM::Worker_TP1'; "
            f"echo '{uuid}, {os.getpid()}, 300, python3'; echo '{uuid}, 4194999, 200, gone'; "
            f"echo '{uuid}, {orphan.pid}, 700, VLLM::Worker_TP0';;\nesac\n"
        )
        (fake / "nvidia-smi").chmod(0o755)
        monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
        use = local_host.get_fact(NvidiaGpuUse, deployments_dir=str(tmp_path / "deployments"))
    finally:
        os.killpg(server.pid, 15)
        server.wait()
        orphan.kill()
        orphan.wait()
    assert [(p.pid, p.deployment) for p in use.processes] == [
        (child, "tp2"), (os.getpid(), None), (4194999, "?"), (orphan.pid, "tp2")]
    assert use.others(0, "tp2") == (500, use.processes[1:3])


# ---------------------------------------------------------------- nvlink_multicast


def site(**data) -> dict:
    return {"model": "tiny-llama", "vllm": {"package": "vllm", "version": "0.26.0"}, **data}


def test_nvlink_multicast_off_is_a_documented_setting():
    field = SiteSettings.model_fields["nvlink_multicast"]
    assert field.default is True
    for name in NVLINK_MULTICAST_OFF:
        assert name in field.description
    assert SiteSettings(**site(nvlink_multicast=False, env={"NCCL_NVLS_ENABLE": "0"})).env == {"NCCL_NVLS_ENABLE": "0"}
    with pytest.raises(ValueError, match="env.NCCL_NVLS_ENABLE is '1' but nvlink_multicast = False sets it to '0'"):
        SiteSettings(**site(nvlink_multicast=False, env={"NCCL_NVLS_ENABLE": "1"}))


def test_h200_site_sets_it_and_no_env_line_by_hand():
    text = (REPO / "inventory" / "h200.py").read_text()
    assert '"nvlink_multicast": False' in text
    for name in NVLINK_MULTICAST_OFF:
        assert f'"{name}"' not in text
