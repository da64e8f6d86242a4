"""Tiny fake wheels served as PEP 503 indexes on loopback, laid out like wheels.vllm.ai.

Used by the runtime tests to reproduce the vLLM nightly traps with real uv and no network:

    base/
      pypi/<project>/index.html        a PyPI stand-in (stable releases, torch, dependencies)
      <commit>/vllm/index.html         per-commit index (the default variant), links to ../<wheel>
      <commit>/<variant>/vllm/...      per-commit index of a variant (cu130, cpu, ...)
      <commit>/*.whl                   every wheel of that commit
      nightly/vllm/index.html          one build: the newest commit's, links to ../../<commit>/<wheel>
      <version>/vllm/index.html        release indexes

That layout is vLLM's own (docs.vllm.ai contributing/ci/nightly_builds: wheels stored under
/{commit}/, indexes with relative links regenerated into /{commit}/, /nightly/ and /{version}/).

Wheels are pure Python and built with zipfile alone: a ``<name>/__init__.py`` with
``__version__``, optional extra files, a ``<name>`` console script printing the version,
METADATA with Requires-Dist, WHEEL and a RECORD with sha256 of every file.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
import shutil
import threading
import urllib.parse
import zipfile
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(
    folder: Path,
    name: str,
    version: str,
    requires: tuple[str, ...] = (),
    files: dict[str, str] | None = None,
    script: bool = True,
    broken: bool = False,
) -> Path:
    """A pure-Python wheel ``<name>-<version>-py3-none-any.whl`` in ``folder``.

    ``files`` adds module files (path inside the wheel -> text). ``broken`` writes a RECORD
    whose hash does not match, which installers refuse.
    """
    module = name.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    members: dict[str, bytes] = {
        f"{module}/__init__.py": f'__version__ = "{version}"\n'.encode(),
        f"{module}/cli.py": (
            "import sys\n"
            f"from {module} import __version__\n\n"
            "def main():\n"
            "    print(__version__)\n"
            "    return 0\n"
        ).encode(),
    }
    for path, text in (files or {}).items():
        members[path] = text.encode()
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Requires-Dist: {r}" for r in requires]
    members[f"{dist}/METADATA"] = ("\n".join(metadata) + "\n").encode()
    members[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: heavylift-testbed\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    if script:
        members[f"{dist}/entry_points.txt"] = f"[console_scripts]\n{name} = {module}.cli:main\n".encode()
    record = [f"{path},{_record_hash(data)},{len(data)}" for path, data in members.items()]
    if broken:
        record[0] = f"{module}/__init__.py,sha256=AAAA,1"
    record.append(f"{dist}/RECORD,,")
    members[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()

    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in members.items():
            archive.writestr(path, data)
    return wheel


def _write_project_page(folder: Path, project: str, wheels: list[tuple[str, Path]]) -> None:
    """``folder/<project>/index.html`` listing (href, wheel) pairs with their sha256 (PEP 503)."""
    page = folder / project
    page.mkdir(parents=True, exist_ok=True)
    links = []
    for href, wheel in wheels:
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        links.append(f'<a href="{html.escape(href)}#sha256={digest}">{html.escape(wheel.name)}</a><br/>')
    (page / "index.html").write_text(
        "<!DOCTYPE html>\n<html><body>\n<h1>Links for " + project + "</h1>\n" + "\n".join(links) + "\n</body></html>\n"
    )
    root = folder / "index.html"
    names = sorted({p.name for p in folder.iterdir() if (p / "index.html").is_file()})
    root.write_text("<!DOCTYPE html>\n<html><body>\n" + "\n".join(f'<a href="{n}/">{n}</a><br/>' for n in names) + "\n</body></html>\n")


def quoted_name(wheel: Path) -> str:
    # S3 escapes '+' in keys; vLLM's index generator writes %2B (docs: nightly_builds)
    return urllib.parse.quote(wheel.name)


class WheelIndex:
    """A folder of fake wheels and indexes, served on 127.0.0.1 while in use."""

    def __init__(self, base: Path):
        self.base = Path(base)
        self.base.mkdir(parents=True, exist_ok=True)
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None
        self.requests: list[str] = []

    # ---------------------------------------------------------------- content

    def add_pypi(self, name: str, version: str, **kwargs) -> Path:
        """A wheel on the PyPI stand-in (``<url>/pypi/``)."""
        store = self.base / "pypi-files"
        wheel = build_wheel(store, name, version, **kwargs)
        project = re.sub(r"[-_.]+", "-", name).lower()
        wheels = sorted(p for p in store.glob("*.whl") if re.sub(r"[-_.]+", "-", p.name.split("-")[0]).lower() == project)
        _write_project_page(self.base / "pypi", project, [(f"../../pypi-files/{quoted_name(w)}", w) for w in wheels])
        return wheel

    def add_commit(self, commit: str, version: str, variant: str | None = None, **kwargs) -> Path:
        """A vLLM build at a commit: the wheel under /<commit>/ and its per-commit index."""
        assert re.fullmatch(r"[0-9a-f]{40}", commit), commit
        store = self.base / commit
        wheel = build_wheel(store, "vllm", version, **kwargs)
        index = store / variant if variant else store
        depth = "../.." if variant else ".."
        same_variant = [w for w in store.glob("vllm-*.whl") if _variant(w.name) == variant]
        _write_project_page(index, "vllm", [(f"{depth}/{quoted_name(w)}", w) for w in sorted(same_variant)])
        return wheel

    def publish_nightly(self, commit: str, variant: str | None = None) -> None:
        """/nightly/ (one build: this commit's) replaces whatever it held, as vLLM's CI does."""
        nightly = self.base / "nightly"
        index = nightly / variant if variant else nightly
        if (index / "vllm").exists():
            shutil.rmtree(index / "vllm")
        depth = "../../.." if variant else "../.."
        wheels = [w for w in sorted((self.base / commit).glob("vllm-*.whl")) if _variant(w.name) == variant]
        _write_project_page(index, "vllm", [(f"{depth}/{commit}/{quoted_name(w)}", w) for w in wheels])

    # ---------------------------------------------------------------- serving

    @property
    def url(self) -> str:
        assert self.server is not None, "not serving"
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> WheelIndex:
        requests = self.requests

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, format, *args):  # noqa: A002 - the base class's name
                requests.append(self.path)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(self.base)))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self) -> WheelIndex:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def _variant(filename: str) -> str | None:
    """The variant a vLLM wheel's local version names (``+cu130``, ``+g<sha>.cpu``), None for the default."""
    version = filename.split("-")[1]
    local = urllib.parse.unquote(version).partition("+")[2]
    parts = [p for p in local.split(".") if p and not re.fullmatch(r"g[0-9a-f]+", p)]
    return parts[-1] if parts else None


def pytorch_index(base: Path, wheels: list[Path], variant: str = "cpu") -> Path:
    """A stand-in for PyTorch's wheel index (``https://download.pytorch.org/whl/<variant>/``) in ``base``.

    Laid out as PyTorch serves it: ``whl/<variant>/<project>/index.html`` links each wheel by an
    absolute path (``/whl/<variant>/torch-2.13.0%2Bcpu-...whl#sha256=...``) beside the pages.
    ``wheels`` are linked in, not copied. Serve ``base`` (``WheelIndex(base).start()``); the index
    is then ``<url>/whl/<variant>``. Returns the index folder.
    """
    index = Path(base) / "whl" / variant
    index.mkdir(parents=True, exist_ok=True)
    by_project: dict[str, list[Path]] = {}
    for wheel in wheels:
        target = index / wheel.name
        if not target.exists():
            target.symlink_to(Path(wheel).resolve())
        project = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        by_project.setdefault(project, []).append(target)
    for project, files in by_project.items():
        _write_project_page(index, project, [(f"/whl/{variant}/{quoted_name(w)}", w) for w in sorted(files)])
    return index
