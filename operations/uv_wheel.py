"""uv's binary from PyPI's ``uv`` wheel, with the standard library alone.

uv publishes its static binary inside per-platform PyPI wheels (``uv-<version>.data/scripts/uv``).
Taking it from there needs no pip, no venv and no installer script: only ``python3``. heavylift
uses it twice: the control machine's own uv (``scripts/bootstrap.sh`` runs this module with a bare
``python3``, which on Debian 12 has no pip and refuses pip installs, PEP 668) and the hosts' uv
(``operations.runtime.uv``, cached on the control machine).

    python3 -m operations.uv_wheel VERSION DEST     # DEST: the binary's path, e.g. .tools/bin/uv

Keep this module free of third-party imports: it runs before any venv exists.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import sys
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

# `uname -m` -> the platform tag of uv's wheels on PyPI
PLATFORMS = {
    "x86_64": "manylinux_2_17_x86_64",
    "aarch64": "manylinux_2_17_aarch64",
}
PYPI_SIMPLE = os.environ.get("HEAVYLIFT_PYPI_SIMPLE", "https://pypi.org/simple/")


class UvWheelError(Exception):
    """uv's wheel could not be found or does not match its index's sha256."""


def platform_tag(machine: str) -> str:
    tag = PLATFORMS.get(machine)
    if tag is None:
        raise UvWheelError(f"no uv wheel known for CPU '{machine}' (known: {', '.join(PLATFORMS)})")
    return tag


def wheel_bytes(version: str, tag: str, index: str = PYPI_SIMPLE, wheelhouse: str | None = None) -> bytes:
    """The bytes of uv's wheel for a platform tag: from a local wheelhouse, or from the index, checked against its sha256."""
    if wheelhouse:
        # air-gapped: the uv wheel comes with the others (pip download uv==VERSION --platform ...)
        found = sorted(Path(wheelhouse).glob(f"uv-{version}-*{tag}*.whl"))
        if not found:
            raise UvWheelError(
                f"the wheelhouse {wheelhouse} has no uv {version} wheel for {tag} "
                f"(add it: pip download uv=={version} --only-binary=:all: --platform {tag} -d {wheelhouse})"
            )
        return found[0].read_bytes()
    # the simple index in its JSON form (PEP 691): file names, URLs and sha256 of a project
    request = urllib.request.Request(index + "uv/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            listing = json.load(answer)
        wheel = next((f for f in listing["files"] if f["filename"].startswith(f"uv-{version}-") and tag in f["filename"]), None)
        if wheel is None:
            raise UvWheelError(f"{index} has no uv {version} wheel for {tag}")
        url = urllib.parse.urljoin(index + "uv/", wheel["url"])
        with urllib.request.urlopen(url, timeout=300) as answer:
            data = answer.read()
    except (OSError, ValueError, KeyError) as error:  # URLError is an OSError; a page that is not the JSON index
        raise UvWheelError(
            f"cannot fetch uv {version}'s wheel from {index} ({getattr(error, 'reason', error)}): reach that index "
            "from the control machine, set HEAVYLIFT_PYPI_SIMPLE to a mirror, or name a wheelhouse holding the uv wheel "
            "(vllm.wheelhouse)"
        ) from None
    if hashlib.sha256(data).hexdigest() != wheel["hashes"]["sha256"]:
        raise UvWheelError(f"uv wheel {wheel['filename']} does not match PyPI's sha256")
    return data


def write_binary(data: bytes, binary: Path) -> Path:
    """Extract ``uv`` from the wheel's bytes to ``binary`` (mode 0755), never leaving a half-written file under that name."""
    archive = zipfile.ZipFile(io.BytesIO(data))
    member = next(n for n in archive.namelist() if n.endswith("/scripts/uv"))
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name(binary.name + ".partial")
    partial.write_bytes(archive.read(member))
    partial.chmod(0o755)
    partial.rename(binary)
    return binary


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python3 -m operations.uv_wheel VERSION DEST", file=sys.stderr)
        return 2
    version, dest = argv
    try:
        tag = platform_tag(platform.machine())
        write_binary(wheel_bytes(version, tag), Path(dest))
    except (UvWheelError, OSError, ValueError, KeyError) as error:
        print(f"uv {version}: {error} (index {PYPI_SIMPLE}, set HEAVYLIFT_PYPI_SIMPLE for a mirror)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
