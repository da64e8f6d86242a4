"""Secrets: the HF token and the API key, read on the control machine, written only into a 0600 file.

The inventory names where a secret is (``env:NAME`` or ``file:PATH`` on the control machine),
never the secret. Values are pydantic ``SecretStr`` until they are rendered into the host's
environment file, which is uploaded through stdin into a 0700 folder: no diff, no argument
list, no temporary file in /tmp (pyinfra's ``_sudo`` uploads go through a world-readable
temporary file: pyinfra 3.10 connectors/ssh.py put_file), and a pyinfra ``-vvv`` or
``--dry --diff`` run shows only a hash of the file.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shlex
import stat
from pathlib import Path

from pydantic import SecretStr
from pyinfra import host, logger, state
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.api.util import get_template
from pyinfra.facts.files import Sha256File

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


def render_env_file(template: str, deployment: str, secrets: dict[str, SecretStr]) -> str:
    values = {name: shlex.quote(secret.get_secret_value()) for name, secret in secrets.items()}
    return get_template(template).render(deployment=deployment, env=values)


def shown_without_values(text: str) -> list[str]:
    """The lines of an environment file with every value replaced: comments and names stay."""
    lines = []
    for line in text.splitlines():
        name, equals, _ = line.partition("=")
        if line.strip() and not line.lstrip().startswith("#") and equals:
            line = f"{name}=<not shown>"
        elif line.strip() and not line.lstrip().startswith("#"):
            line = "<not shown>"
        lines.append(line)
    return lines


@operation()
def env_file(path: str, content: SecretStr | str, mode: str = "600"):
    """
    A secrets file on the host with exactly this content, owned by root, never shown.

    + path: the file, inside a folder only root can enter (mode 0700)
    + content: the rendered file, as a SecretStr
    + mode: the file's mode
    """
    text = content.get_secret_value() if isinstance(content, SecretStr) else content
    wanted = hashlib.sha256(text.encode()).hexdigest()
    present = host.get_fact(Sha256File, path=path)
    if present == wanted:
        host.noop(f"{path} is up to date (sha256 {wanted[:12]})")
        return
    if state.config.DIFF:
        # what pyinfra's files.put shows, with every value hidden: the names only, never the file's
        # current content (reading it back would bring the secrets to the control machine)
        host.log(f"Will {'modify' if present else 'create'} {path} (values not shown)", logger.info)
        for line in shown_without_values(text):
            logger.info(f"  + {line}")
        logger.info("")
    temporary = posixpath.join(posixpath.dirname(path), "." + posixpath.basename(path) + ".new")
    # umask 077: the file never exists with a wider mode; content arrives on stdin, not argv
    yield StringCommand(
        "sh", "-c", QuoteString('umask 077 && cat > "$1" && chmod "$2" "$1" && mv -f "$1" "$3"'),
        "heavylift-env-file", QuoteString(temporary), QuoteString(mode), QuoteString(path),
        _stdin=text,
    )
