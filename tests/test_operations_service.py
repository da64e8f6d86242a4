"""operations/service.py: starting, restarting and reading vLLM's process under systemd or start-stop-daemon."""

from types import SimpleNamespace

import pytest

from models.errors import HeavyliftConfigError
from operations import service
from resolve.gpus import GpuInventory


def deployment(tp, gpus):
    return SimpleNamespace(name="kimi", tensor_parallel_size=tp, settings=SimpleNamespace(gpus=gpus))


def test_gpu_selection_matches_tensor_parallelism_and_the_host():
    assert service.gpu_selection(deployment(2, [4, 5]), GpuInventory()) == "4,5"
    assert service.gpu_selection(deployment(8, None), GpuInventory()) is None
    with pytest.raises(HeavyliftConfigError, match=r"field 'gpus' names 2 GPUs \(\[0, 1\]\) but tensor_parallel_size is 4"):
        service.gpu_selection(deployment(4, [0, 1]), GpuInventory())
    host = SimpleNamespace(count=8)
    with pytest.raises(HeavyliftConfigError, match="names GPU 9 but the host has 8 GPUs"):
        service.gpu_selection(deployment(2, [8, 9]), host)
