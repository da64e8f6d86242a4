"""The site's secrets, read on the control machine: ``env:NAME`` or ``file:PATH``, never the secret itself.

Values stay pydantic ``SecretStr`` until operations/secrets.py renders them into the host's 0600 file
or resolve/hub.py hands the token to huggingface_hub.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from pydantic import SecretStr

logger = logging.getLogger("pyinfra")  # pyinfra's own logger (pyinfra/__init__.py), so warnings print alike

# setting -> the environment variable vLLM and huggingface_hub read
# HF_TOKEN: huggingface_hub (constants.py, also read by vLLM's downloads);
# VLLM_API_KEY: vLLM 0.32 vllm/envs.py, used by entrypoints/serve/middleware/register.py when
# --api-key is not given (so the key stays out of argv)
SECRET_ENV = {"hf_token": "HF_TOKEN", "api_key": "VLLM_API_KEY"}


class SecretSourceError(ValueError):
    """A secret the inventory names cannot be read on the control machine."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


def read_secret(field: str, source: str, cwd: str | os.PathLike | None = None) -> SecretStr:
    kind, _, where = source.partition(":")
    if kind == "env":
        value = os.environ.get(where)
        if not value:
            raise SecretSourceError(
                f"field {field!r}: the environment variable {where} is not set on the control machine. "
                f"Fix: export {where}=... before running pyinfra, or point {field} at a file (\"file:/path\").", field
            )
    else:
        path = Path(where).expanduser()
        if not path.is_absolute():
            path = Path(cwd or os.getcwd()) / path
        try:
            value = path.read_text(encoding="utf-8").strip()
            mode = path.stat().st_mode
        except OSError as error:
            raise SecretSourceError(
                f"field {field!r}: cannot read {path} on the control machine ({error.strerror}). "
                f"Fix: create it with the secret on one line (chmod 600), or point {field} at another file.", field
            ) from None
        if not value:
            raise SecretSourceError(f"field {field!r}: {path} is empty. Fix: put the secret in it on one line.", field)
        if mode & stat.S_IROTH:
            logger.warning(f"{field}: {path} is readable by every user of the control machine (chmod 600 it)")
    if any(c.isspace() for c in value):
        raise SecretSourceError(f"field {field!r}: the secret from {source} contains whitespace. Fix: one token, one line.", field)
    return SecretStr(value)


def resolve(settings, cwd: str | os.PathLike | None = None) -> dict[str, SecretStr]:
    """Environment variable name -> secret, for every secret the settings name."""
    found = {}
    for field, env_name in SECRET_ENV.items():
        source = getattr(settings, field)
        if source:
            found[env_name] = read_secret(field, source, cwd)
    return found
