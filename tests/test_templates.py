"""The rendered texts: launcher, environment file, systemd unit, patched configs."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.util import get_template

from resolve.overlay import apply_patch, render_json
from resolve.plan import argument_lines, quoted
from operations.release import launcher_lines

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def render(name: str, **data) -> str:
    return get_template(str(TEMPLATES / name)).render(**data)


def test_launcher_passes_every_argument_through_unchanged(tmp_path):
    tricky = ["/bin/echo", "two words", "$HOME", "it's", "--flag=a;b", "--max-model-len", "256", "--enforce-eager"]
    launcher = tmp_path / "serve"
    text = render(
        "serve.sh.j2", deployment="demo", repo="org/m", commit="0" * 40, env_file="/x", command_lines=argument_lines(tricky),
        relative=False, env_lines=[],
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


def test_release_launcher_runs_its_own_venv_and_overlay_from_any_folder(tmp_path):
    """The launcher names its venv and overlay relative to its own folder: the same text serves from
    the staging folder and from each release folder a copy of it lands in (operations/release.py)."""
    staging = tmp_path / "deployment"
    args = [f"{staging}/venv/bin/python", "--model", f"{staging}/overlay", "--port", "8000"]
    text = render(
        "serve.sh.j2", deployment="demo", repo="org/m", commit="0" * 40, env_file="/x", relative=True,
        env_lines=["CUDA_VISIBLE_DEVICES=2,3", "SPACED='a b'"],
        command_lines=launcher_lines(args, {f"{staging}/venv": "venv", f"{staging}/overlay": "overlay"}),
    )
    assert str(staging) not in text
    for name in ("releases/r1", "releases/r 2"):
        folder = tmp_path / name
        (folder / "venv" / "bin").mkdir(parents=True)
        python = folder / "venv" / "bin" / "python"
        python.write_text('#!/bin/sh\nprintf "%s|%s|%s\\n" "$CUDA_VISIBLE_DEVICES" "$SPACED" "$*"\n')
        python.chmod(0o755)
        (folder / "serve").write_text(text)
        (folder / "serve").chmod(0o755)
        link = tmp_path / "current"
        link.unlink(missing_ok=True)
        link.symlink_to(folder)
        out = subprocess.run([str(link / "serve")], capture_output=True, text=True, check=True).stdout
        assert out == f"2,3|a b|--model {folder}/overlay --port 8000\n"


UNIT = dict(
    deployment="demo", repo="org/m", commit="0" * 40, service_user="heavylift", probe_script="/opt/heavylift/lib/readiness_probe.py",
    health_url="http://127.0.0.1:8000", timeout_start=3600, timeout_stop=60, restart_sec=10, restart_backoff=False,
    restart_max_delay=300, limit_nofile=1048576,
)


def render_unit(tmp_path, **overrides):
    launcher = tmp_path / "serve"
    launcher.write_text("#!/bin/sh\nexit 0\n")
    launcher.chmod(0o755)
    (tmp_path / "serve.env").write_text("")
    unit = tmp_path / "heavylift-demo.service"
    unit.write_text(render("vllm.service.j2", **{**UNIT, "env_file": str(tmp_path / "serve.env"), "launcher": str(launcher),
                                                 **overrides}))
    return unit


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze missing: run scripts/bootstrap.sh")
def test_unit_passes_systemd_analyze_verify(tmp_path):
    unit = render_unit(tmp_path)
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    # systemd-analyze exits 0 even on lines it cannot parse: any complaint is a failure
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr
    text = unit.read_text()
    for line in ("User=heavylift", "Group=heavylift", f"EnvironmentFile={tmp_path}/serve.env", "TimeoutStartSec=3600",
                 "TimeoutStopSec=60", "KillMode=mixed", "Restart=always", "RestartSec=10", "LimitNOFILE=1048576",
                 "ExecStartPost=/usr/bin/python3 /opt/heavylift/lib/readiness_probe.py wait-health http://127.0.0.1:8000",
                 "ExecStart=" + str(tmp_path / "serve")):
        assert line in text.splitlines(), line
    # the back-off keys of systemd 254+ only where the host's systemd knows them
    assert "RestartSteps" not in text


def test_unit_backoff_for_newer_systemd(tmp_path):
    text = render_unit(tmp_path, restart_backoff=True, restart_max_delay=600).read_text().splitlines()
    assert "RestartSteps=5" in text and "RestartMaxDelaySec=600" in text


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze missing")
def test_unit_backoff_keys_are_unknown_to_this_systemd(tmp_path):
    """Why the back-off keys are conditional: systemd 252 (Debian 12) complains about them."""
    version = int(subprocess.run(["systemctl", "--version"], capture_output=True, text=True).stdout.split()[1])
    unit = render_unit(tmp_path, restart_backoff=True)
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    if version < 254:
        assert "RestartSteps" in result.stderr
    else:
        assert result.stderr.strip() == ""


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
