"""The NvidiaGpus fact: nvidia-smi output -> GpuInventory, for real host shapes and for hosts without GPUs.

Cases: tests/fixtures/nvidia-smi/<case>.json
    nvidia_smi    what nvidia-smi prints: query (--query-gpu ...), version (--version; null: the
                  option is unknown), table (no arguments), *_status exit codes; null: not installed
    fact_output   the lines the fact's command prints for it
    inventory     GpuInventory.to_json() of the parsed fact
    arch, count, summary

Each case runs twice: the parser on fact_output, and the fact's real command through pyinfra's
@local connector with a fake nvidia-smi built from the case on PATH.
"""

import json
import os
import shutil
from pathlib import Path

import pytest

from operations.gpu import COMMAND, Gpu, GpuInventory, NvidiaGpus, parse_nvidia_smi

CASES_DIR = Path(__file__).parent / "fixtures" / "nvidia-smi"
CASES = {path.stem: json.loads(path.read_text()) for path in sorted(CASES_DIR.glob("*.json"))}


@pytest.mark.parametrize("name", sorted(CASES))
def test_parse(name):
    case = CASES[name]
    inventory = NvidiaGpus().process(case["fact_output"])
    assert inventory.to_json() == case["inventory"]
    assert inventory.arch == case["arch"]
    assert inventory.count == case["count"]
    assert inventory.summary() == case["summary"]
    assert GpuInventory.from_json(json.loads(json.dumps(inventory.to_json()))) == inventory
    assert (inventory.problem is None) == (inventory.count > 0)


def test_every_shape_is_covered():
    assert {"rtx-pro-6000-x8", "h200-x8", "no-nvidia-smi"} <= set(CASES)


def test_command_is_one_shell_line_that_always_succeeds():
    command = NvidiaGpus().command()
    assert command == COMMAND
    assert "--query-gpu=index,name,compute_cap,memory.total,driver_version" in command
    assert "--format=csv,noheader,nounits" in command
    assert command.startswith("if command -v nvidia-smi") and command.endswith("else echo absent; fi")


def test_empty_output_is_the_default_no_gpu():
    default = NvidiaGpus().default()
    assert default.count == 0 and default.arch is None and default.problem


def test_gpu_arch_names():
    assert Gpu(0, "x", (12, 0), 1).arch == "sm120"
    assert Gpu(0, "x", (9, 0), 1).arch == "sm90"
    assert Gpu(0, "x", (10, 0), 1).arch == "sm100"
    assert Gpu(0, "x", (8, 6), 1).arch == "sm86"


def test_unparsable_lines_become_the_problem_not_gpus():
    inventory = parse_nvidia_smi(["gpu: 0, NVIDIA X, twelve, 1, 2", "something else"])
    assert inventory.count == 0
    assert "twelve" in inventory.problem and "something else" in inventory.problem


def test_min_memory_needs_every_gpu():
    gpus = (Gpu(0, "a", (9, 0), 100), Gpu(1, "b", (9, 0), None))
    assert GpuInventory(gpus=gpus).min_memory_mib is None
    assert GpuInventory(gpus=gpus[:1]).min_memory_mib == 100
    assert GpuInventory(gpus=gpus).compute_capability == (9, 0)


# --- live: the real command through pyinfra's @local connector, a fake nvidia-smi on PATH --------


def fake_nvidia_smi(folder: Path, spec: dict) -> None:
    """An nvidia-smi that answers the three invocations the fact makes, as the case says."""
    data = folder / "data"
    data.mkdir()
    (data / "query").write_text(spec["query"])
    lines = ["#!/bin/sh", 'case "$1" in']
    lines.append(f"  --query-gpu=*) cat '{data}/query'; exit {spec.get('query_status', 0)};;")
    if spec.get("version") is not None:
        (data / "version").write_text(spec["version"])
        lines.append(f"  --version) cat '{data}/version'; exit 0;;")
    else:
        lines.append("  --version) echo 'Invalid combination of input arguments.' >&2; exit 2;;")
    (data / "table").write_text(spec.get("table", ""))
    lines.append(f"  '') cat '{data}/table'; exit {spec.get('table_status', 0)};;")
    lines.append("esac")
    script = folder / "nvidia-smi"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)


@pytest.mark.parametrize("name", sorted(CASES))
def test_live_command(name, local_host, tmp_path, monkeypatch):
    case = CASES[name]
    tools = tmp_path / "tools"
    tools.mkdir()
    # only the tools the command needs, so that a real nvidia-smi elsewhere on PATH cannot answer
    for tool in ("sh", "sed", "head", "cat"):
        found = shutil.which(tool)
        assert found, f"{tool} not found"
        (tools / tool).symlink_to(found)
    path = [str(tools)]
    if case["nvidia_smi"] is not None:
        fake = tmp_path / "fake"
        fake.mkdir()
        fake_nvidia_smi(fake, case["nvidia_smi"])
        path.insert(0, str(fake))
    monkeypatch.setenv("PATH", os.pathsep.join(path))

    inventory = local_host.get_fact(NvidiaGpus)
    assert inventory.to_json() == case["inventory"]
