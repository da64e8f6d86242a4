"""resolve/secrets.py: the site's secrets read on the control machine from ``env:NAME`` or ``file:PATH``."""

import logging

import pytest

from models.schema import SiteSettings
from resolve import secrets


def settings(**data):
    return SiteSettings.model_validate({"model": "tiny-llama", "vllm": {"version": "0.34.0"}, **data})


def test_missing_secret_names_field_and_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    with pytest.raises(secrets.SecretSourceError, match=r"field 'api_key': the environment variable NOT_SET_ANYWHERE is not set"):
        secrets.resolve(settings(api_key="env:NOT_SET_ANYWHERE"))
    with pytest.raises(secrets.SecretSourceError, match=r"field 'hf_token': cannot read .*nope"):
        secrets.resolve(settings(hf_token=f"file:{tmp_path}/nope"))


def test_a_relative_file_is_read_from_the_inventorys_folder(tmp_path):
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "hf").write_text("hf_relative\n")
    (tmp_path / "secrets" / "hf").chmod(0o600)
    found = secrets.resolve(settings(hf_token="file:secrets/hf"), cwd=tmp_path)
    assert found["HF_TOKEN"].get_secret_value() == "hf_relative"


def test_an_empty_file_is_refused_naming_the_field_and_the_fix(tmp_path):
    empty = tmp_path / "key"
    empty.write_text("\n")
    with pytest.raises(secrets.SecretSourceError) as refused:
        secrets.read_secret("api_key", f"file:{empty}")
    assert str(refused.value) == f"field 'api_key': {empty} is empty. Fix: put the secret in it on one line."
    assert refused.value.field == "api_key"


@pytest.mark.parametrize("value", ["hf_one two", "hf_tab\there", "hf_first\nhf_second"])
def test_a_secret_with_whitespace_is_refused_without_showing_it(value, monkeypatch):
    monkeypatch.setenv("SPACED_TOKEN", value)
    with pytest.raises(secrets.SecretSourceError) as refused:
        secrets.read_secret("hf_token", "env:SPACED_TOKEN")
    said = str(refused.value)
    assert said.startswith("field 'hf_token': the secret from env:SPACED_TOKEN contains whitespace")
    assert value not in said and value.split()[0] not in said


def test_an_empty_environment_variable_counts_as_unset(monkeypatch):
    monkeypatch.setenv("EMPTY_TOKEN", "")
    with pytest.raises(secrets.SecretSourceError, match="EMPTY_TOKEN is not set on the control machine. Fix: export"):
        secrets.read_secret("hf_token", "env:EMPTY_TOKEN")


def test_a_file_every_user_can_read_is_used_with_a_warning(tmp_path, caplog):
    key = tmp_path / "key"
    key.write_text("sk-open\n")
    key.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        value = secrets.read_secret("api_key", f"file:{key}")
    assert value.get_secret_value() == "sk-open"
    assert caplog.messages == [f"api_key: {key} is readable by every user of the control machine (chmod 600 it)"]
    caplog.clear()
    key.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        secrets.read_secret("api_key", f"file:{key}")
    assert caplog.messages == []


def test_only_the_secrets_the_settings_name_are_read(monkeypatch):
    monkeypatch.setenv("ONLY_HF", "hf_x")
    assert set(secrets.resolve(settings(hf_token="env:ONLY_HF"))) == {"HF_TOKEN"}
    assert secrets.resolve(settings()) == {}
