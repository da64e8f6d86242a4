"""The rendered texts: launcher, environment file, systemd unit, patched configs."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.util import get_template

from operations.checkpoint import apply_patch, render_json
from operations.plan import argument_lines, quoted

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def render(name: str, **data) -> str:
    return get_template(str(TEMPLATES / name)).render(**data)


def test_launcher_passes_every_argument_through_unchanged(tmp_path):
    tricky = ["/bin/echo", "two words", "$HOME", "it's", "--flag=a;b", "--max-model-len", "256", "--enforce-eager"]
    launcher = tmp_path / "serve"
    text = render(
        "serve.sh.j2", deployment="demo", repo="org/m", commit="0" * 40, env_file="/x", command_lines=argument_lines(tricky)
    )
    launcher.write_text(text)
    out = subprocess.run(["sh", str(launcher)], capture_output=True, text=True, check=True).stdout
    assert out == "two words $HOME it's --flag=a;b --max-model-len 256 --enforce-eager\n"
    # one option and its value per line, so a diff shows exactly the option that changed
    assert "    --max-model-len 256 \\\n" in text


def test_environment_file_values_survive_sourcing(tmp_path):
    env = {"PLAIN": "1", "SPACES": "a b c", "QUOTE": "it's \"quoted\"", "DOLLAR": "$HOME"}
    env_file = tmp_path / "serve.env"
    env_file.write_text(render("serve.env.j2", deployment="demo", env={k: quoted([v])[0] for k, v in env.items()}))
    script = f"set -a; . {env_file}; " + "; ".join(f'printf "%s\\n" "${k}"' for k in env)
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True, env={}).stdout
    assert out.splitlines() == list(env.values())


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze missing: run scripts/bootstrap.sh")
def test_unit_passes_systemd_analyze_verify(tmp_path):
    launcher = tmp_path / "serve"
    launcher.write_text("#!/bin/sh\nexit 0\n")
    launcher.chmod(0o755)
    (tmp_path / "serve.env").write_text("")
    unit = tmp_path / "heavylift-demo.service"
    unit.write_text(
        render(
            "vllm.service.j2", deployment="demo", repo="org/m", commit="0" * 40,
            env_file=str(tmp_path / "serve.env"), launcher=str(launcher), timeout_start=3600,
        )
    )
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    # systemd-analyze exits 0 even on lines it cannot parse: any complaint is a failure
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr
    assert "ExecStart=" + str(launcher) in unit.read_text()


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze missing")
def test_systemd_analyze_check_catches_a_broken_unit(tmp_path):
    # the check above can fail: a bad line shows up on stderr
    unit = tmp_path / "broken.service"
    unit.write_text("[Service]\nType=bogus\nExecStart=/bin/true\n")
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert "Failed to parse service type" in result.stderr


KIMI_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "quantization_config": {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "dynamic": False},
    },
}
KIMI_QUANT = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}}


def test_kimi_patch_strips_fp8_kv_cache_and_nothing_else():
    config = apply_patch(KIMI_CONFIG, ["quantization_config.kv_cache_scheme"], {})
    quant = apply_patch(KIMI_QUANT, ["quantization.kv_cache_quant_algo"], {})
    assert "kv_cache_scheme" not in config["quantization_config"]
    assert config["quantization_config"]["quant_algo"] == "NVFP4"
    assert quant == {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}
    # the pristine documents are untouched
    assert KIMI_CONFIG["quantization_config"]["kv_cache_scheme"]["num_bits"] == 8
    assert KIMI_QUANT["quantization"]["kv_cache_quant_algo"] == "FP8"


def test_patch_is_idempotent_and_renders_stable_text():
    once = apply_patch(KIMI_CONFIG, ["quantization_config.kv_cache_scheme"], {"max_position_embeddings": 4096})
    twice = apply_patch(once, ["quantization_config.kv_cache_scheme"], {"max_position_embeddings": 4096})
    assert once == twice
    assert render_json(once) == render_json(twice)
    assert json.loads(render_json(once))["max_position_embeddings"] == 4096


def test_rendered_config_template_is_the_json_document():
    document = render_json(apply_patch(KIMI_QUANT, ["quantization.kv_cache_quant_algo"], {}))
    text = render("config.json.j2", repo="nvidia/Kimi-K2.5-NVFP4", commit="0" * 40, document=document.rstrip("\n"))
    assert json.loads(text) == {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}
