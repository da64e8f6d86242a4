"""operations/secrets.py: the secrets' environment file, rendered on the control machine and written on the host
without a diff, an argument list or a temporary file anyone else can read."""

import json
import logging
import subprocess
from pathlib import Path

import pytest
from pydantic import SecretStr
from pyinfra.context import ctx_host, ctx_state

from models.schema import SiteSettings
from operations import secrets
from pyinfra_fixtures import FakeHost, FakeState, run_operation

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def settings(**data):
    return SiteSettings.model_validate({"model": "tiny-llama", "vllm": {"version": "0.34.0"}, **data})


def test_secrets_come_from_the_environment_or_a_file(tmp_path, monkeypatch):
    key_file = tmp_path / "api key"
    key_file.write_text("sk-from-file\n")
    key_file.chmod(0o600)
    monkeypatch.setenv("MY_HF_TOKEN", "hf_from_env")
    found = secrets.resolve(settings(hf_token="env:MY_HF_TOKEN", api_key=f"file:{key_file}"))
    assert {k: v.get_secret_value() for k, v in found.items()} == {"HF_TOKEN": "hf_from_env", "VLLM_API_KEY": "sk-from-file"}
    assert "hf_from_env" not in repr(found)
    text = secrets.render_env_file(str(TEMPLATES / "serve.env.j2"), "demo", found)
    script = "set -a; . /dev/stdin; printf '%s|%s' \"$HF_TOKEN\" \"$VLLM_API_KEY\""
    assert subprocess.run(["sh", "-c", script], input=text, capture_output=True, text=True).stdout == "hf_from_env|sk-from-file"


def test_env_file_op_is_never_a_diff_and_never_argv():
    commands, _ = run_operation(secrets.env_file, {"path": "/p/serve.env", "content": "VLLM_API_KEY=sk-secret\n"},
                                {"files.Sha256File": {"path=/p/serve.env": None}})
    assert len(commands) == 1 and "sk-secret" not in json.dumps(commands)


def env_file_commands(path, content, present=None, diff=False) -> list:
    """The operation's commands (StringCommands, stdin included), as pyinfra's planning pass gets them."""
    state, host = FakeState(), FakeHost({"files.Sha256File": {f"path={path}": present}})
    state.config.DIFF = diff
    with ctx_state.use(state), ctx_host.use(host):
        return list(secrets.env_file._inner(path=str(path), content=content))


def test_the_diff_shows_the_names_and_comments_never_the_values(caplog):
    """pyinfra --dry --diff: what would change, with every value hidden (the file is never read back either)."""
    text = "# Secrets of vLLM\nHF_TOKEN=hf_secret_value\nVLLM_API_KEY='sk secret'\n\nstray-line\n"
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        commands = env_file_commands("/p/serve.env", SecretStr(text), present="0" * 64, diff=True)
    assert len(commands) == 1
    assert [m.strip() for m in caplog.messages] == [
        "+ # Secrets of vLLM", "+ HF_TOKEN=<not shown>", "+ VLLM_API_KEY=<not shown>", "+", "+ <not shown>", ""]
    assert "hf_secret_value" not in caplog.text and "sk secret" not in caplog.text


@pytest.mark.parametrize("content", ["VLLM_API_KEY=sk-1\n", SecretStr("VLLM_API_KEY=sk-1\n")])
def test_the_file_is_written_through_stdin_with_its_mode(tmp_path, content):
    """The command a shell runs, with the content on stdin: the file holds exactly it, with mode 600, no .new left."""
    path = tmp_path / "private dir" / "serve.env"
    path.parent.mkdir()
    (command,) = env_file_commands(path, content)
    assert "sk-1" not in command.get_raw_value()
    subprocess.run(["sh", "-c", command.get_raw_value()], input=command.connector_arguments["_stdin"], text=True, check=True)
    assert path.read_text() == "VLLM_API_KEY=sk-1\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["serve.env"]
