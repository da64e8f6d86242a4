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
import posixpath
import shlex

from pydantic import SecretStr
from pyinfra import host, logger, state
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.api.util import get_template
from pyinfra.facts.files import Sha256File

from resolve.secrets import SECRET_ENV, SecretSourceError, read_secret, resolve  # noqa: F401 (read on the control side)


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
