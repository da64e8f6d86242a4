"""vLLM build resolution: what the site asked for -> one exact build and the index that holds it. Control side.

A request is a release (``version: 0.34.0``), a nightly at one commit (``nightly: <40 hex>``)
or ``nightly: latest``, plus a variant (cu130, cu129, cpu...). The answer, a ``Build``, is an
exact version and the one index it is installed from; the host then runs
``uv pip install vllm==<version>`` against that index only. Rules (vLLM's wheel indexes as
documented in docs.vllm.ai contributing/ci/nightly_builds, checked 2026-09; uv 0.13.x):

- ``<base>/nightly/`` holds **one** build, the newest commit's; every build stays at
  ``<base>/<full commit>/`` (variants in ``<commit>/<variant>/``). An older nightly is only
  installable from its per-commit index, so heavylift always installs from there, also for
  ``latest`` (resolved once, recorded in the lock file).
- The nightly page links each wheel relatively (``../../<commit>/vllm-...whl``), which is
  how ``latest`` learns the full commit.
- PEP 440 sorts ``0.16.0rc2.dev314`` *below* ``0.16``: ``vllm>=0.16`` never matches a 0.16
  nightly, with or without ``--prerelease=allow``. heavylift installs ``==<exact version>``.
- uv takes a package's versions from the first index that has it (``first-index``, uv docs
  concepts/indexes); ``unsafe-best-match`` would pick PyPI's stable release over the nightly.
  heavylift passes ``--index-strategy first-index`` explicitly so a host's UV_INDEX_STRATEGY or
  uv.toml cannot change it.
- uv's pre-release handling of *dependencies* changed between releases (0.9.x: a nightly's
  pre-release dependencies were rejected without ``--prerelease=allow``; ``explicit`` still does
  that in 0.13). heavylift passes ``--prerelease`` explicitly: ``allow`` for a pre-release build,
  ``if-necessary`` for a release.
"""

from __future__ import annotations

import html.parser
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Protocol
from functools import lru_cache

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from . import lockfile, plancache

FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
PYPI_SIMPLE = os.environ.get("HEAVYLIFT_PYPI_SIMPLE", "https://pypi.org/simple/")


class BuildNotFound(ValueError):
    """The requested build is not on the index it would be installed from; raised at plan time."""


@dataclass(frozen=True)
class Wheel:
    filename: str
    url: str
    version: Version
    sha256: str | None = None


@dataclass(frozen=True)
class Build:
    """One exact vLLM build and where it is installed from."""

    package: str
    version: str
    channel: str  # release | nightly
    commit: str | None = None
    variant: str | None = None
    index_url: str | None = None  # the extra index that holds it; None: the default index (PyPI)
    requested: str = ""
    wheels: tuple[Wheel, ...] = field(default=(), compare=False)

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def prerelease(self) -> str:
        # a nightly's own dependencies are pre-releases more often than not (torch, flashinfer RCs)
        return "allow" if Version(self.version).is_prerelease else "if-necessary"

    def label(self) -> str:
        text = f"{self.package} {self.version}"
        if self.commit:
            text += f" (commit {self.commit[:12]})"
        return text + (f" [{self.variant}]" if self.variant else "")


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.links.append(href)


@lru_cache(maxsize=64)
def _project_page(index: str, project: str) -> tuple[Wheel, ...] | None:
    """The wheels a PEP 503 index lists for a project; None when the index has no such project."""
    url = index.rstrip("/") + "/" + project + "/"
    request = urllib.request.Request(url, headers={"Accept": "text/html"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            text = answer.read().decode("utf-8", "replace")
            final = answer.geturl()
    except urllib.error.HTTPError as error:
        if error.code in (403, 404):
            return None
        raise BuildNotFound(f"{url}: HTTP {error.code} {error.reason}") from None
    except (urllib.error.URLError, OSError) as error:
        raise BuildNotFound(f"{url}: cannot read the index ({getattr(error, 'reason', error)})") from None
    parser = _Links()
    parser.feed(text)
    wheels = []
    for href in parser.links:
        absolute, _, fragment = urllib.parse.urljoin(final, href).partition("#")
        filename = urllib.parse.unquote(absolute.rsplit("/", 1)[-1])
        if not filename.endswith(".whl"):
            continue
        try:
            _, version, _, _ = parse_wheel_filename(filename)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        sha = fragment.split("=", 1)[1] if fragment.startswith("sha256=") else None
        wheels.append(Wheel(filename, absolute, version, sha))
    return tuple(wheels)


class WheelIndex(Protocol):
    """What planning asks of a package index: the wheels a PEP 503 page lists, a wheel's PEP 658 core
    metadata, a wheel's bytes. ``SimpleIndex`` asks over HTTP; a unit test hands planning a stand-in."""

    def wheels(self, index: str, project: str) -> tuple[Wheel, ...] | None: ...

    def metadata(self, wheel: Wheel) -> str | None: ...

    def open(self, wheel: Wheel): ...


class SimpleIndex:
    """A real index over HTTP (urllib); each project page is read once per run."""

    def wheels(self, index: str, project: str) -> tuple[Wheel, ...] | None:
        return _project_page(index, project)

    def metadata(self, wheel: Wheel) -> str | None:
        try:
            with urllib.request.urlopen(wheel.url.split("#")[0] + ".metadata", timeout=60) as answer:
                return answer.read().decode()
        except (OSError, ValueError):
            return None

    def open(self, wheel: Wheel):
        return urllib.request.urlopen(wheel.url, timeout=600)


SIMPLE_INDEX = SimpleIndex()


def variant_index(base: str, folder: str, variant: str | None) -> str:
    return f"{base.rstrip('/')}/{folder}/" + (f"{variant}/" if variant else "")


def _commit_of(wheel: Wheel) -> str | None:
    """The full commit a nightly page's link names (``.../<40 hex>/vllm-...whl``)."""
    for part in reversed(urllib.parse.urlparse(wheel.url).path.split("/")[:-1]):
        if FULL_SHA.match(part):
            return part
    return None


def _short_commit(version: Version) -> str | None:
    # vLLM's nightly versions carry the commit as a local segment: 0.16.0rc2.dev314+gf72061a19(.cu130)
    for part in (version.local or "").split("."):
        if re.fullmatch(r"g[0-9a-f]{7,40}", part):
            return part[1:]
    return None


def _listing(versions: list[Version], limit: int = 8) -> str:
    shown = sorted(set(versions))[-limit:]
    more = len(set(versions)) - len(shown)
    return ", ".join(str(v) for v in shown) + (f" (and {more} older)" if more > 0 else "")


def _why_excluded(wanted: Version, present: list[Version]) -> str:
    """Why an index that has other builds does not satisfy ``==wanted``."""
    reasons = []
    # PEP 440 pads a release with zeros when it compares (0.16 == 0.16.0): compare three parts, padded
    def release3(version: Version) -> tuple[int, ...]:
        return (*version.release, 0, 0, 0)[:3]

    pre = sorted(v for v in present if v.is_prerelease and release3(v) == release3(wanted) and not wanted.is_prerelease)
    if pre:
        reasons.append(
            f"{pre[-1]} is a pre-release of {wanted.base_version}: PEP 440 sorts it below {wanted.base_version}, so neither "
            f"=={wanted} nor >={wanted.base_version} matches it; ask for it exactly (version: \"{pre[-1]}\")"
        )
    same_public = sorted(v for v in present if v.public == wanted.public and v != wanted)
    if same_public and wanted.local:
        reasons.append(f"{same_public[-1]} has the same version but another local tag (build or variant)")
    return "; ".join(reasons)


def _resolve_release(runtime, index_client: WheelIndex = SIMPLE_INDEX) -> Build:
    wanted = Version(runtime.version)
    if runtime.index_url or runtime.variant:
        index = runtime.index_url or variant_index(runtime.wheel_index, runtime.version, runtime.variant)
        where = "index"
    else:
        index, where = PYPI_SIMPLE, "PyPI"
    wheels = index_client.wheels(index, runtime.package)
    found = [w for w in wheels or () if w.version == wanted or (not wanted.local and w.version.public == str(wanted))]
    if not found:
        page = f"{index.rstrip('/')}/{runtime.package}/"
        if not wheels:
            raise BuildNotFound(f"{runtime.package}=={runtime.version}: {page} lists no {runtime.package} wheels at all")
        present = [w.version for w in wheels]
        why = _why_excluded(wanted, present)
        priority = ""
        if where == "index":
            priority = (
                f"; uv takes {runtime.package}'s versions only from the first index that has it (this one), so a "
                f"{runtime.version} on PyPI is never considered"
            )
        raise BuildNotFound(
            f"{runtime.package}=={runtime.version} is not on {page}: it has {_listing(present)}"
            + (f". {why}" if why else "") + priority
        )
    version = str(found[0].version)
    return Build(runtime.package, version, "release", variant=runtime.variant,
                 index_url=index if where == "index" else None, requested=runtime.version, wheels=tuple(found))


def _resolve_commit(runtime, commit: str, requested: str, index_client: WheelIndex = SIMPLE_INDEX) -> Build:
    index = variant_index(runtime.wheel_index, commit, runtime.variant)
    wheels = index_client.wheels(index, "vllm")
    page = index + "vllm/"
    if not wheels:
        raise BuildNotFound(
            f"no vLLM build for commit {commit}"
            + (f" in variant {runtime.variant!r}" if runtime.variant else "")
            + f": {page} lists no wheels (a commit not on main, one whose build failed, or a variant it was not built for; "
            "only main's commits are published, and not every variant on every commit)"
        )
    versions = sorted({w.version for w in wheels})
    if runtime.version is not None:
        wanted = Version(runtime.version)
        chosen = [v for v in versions if v == wanted or (not wanted.local and v.public == str(wanted))]
        if not chosen:
            raise BuildNotFound(
                f"vllm=={runtime.version} is not the build of commit {commit[:12]}: {page} has {_listing(versions)}"
                + (f". {_why_excluded(wanted, versions)}" if _why_excluded(wanted, versions) else "")
                + "; remove version to take the commit's build"
            )
        version = chosen[-1]
    else:
        if len(versions) > 1:
            raise BuildNotFound(
                f"commit {commit[:12]} has several builds on {page} ({_listing(versions)}): give version to pick one"
            )
        version = versions[0]
    short = _short_commit(version)
    if short is not None and not commit.startswith(short):
        raise BuildNotFound(f"{page} lists {version}, whose commit tag g{short} is not commit {commit}")
    return Build("vllm", str(version), "nightly", commit=commit, variant=runtime.variant, index_url=index,
                 requested=requested, wheels=tuple(w for w in wheels if w.version == version))


def latest_nightly(runtime, index_client: WheelIndex = SIMPLE_INDEX) -> tuple[str, str]:
    """(version, full commit) of the one build on ``<base>/nightly/[variant/]``."""
    index = variant_index(runtime.wheel_index, "nightly", runtime.variant)
    wheels = index_client.wheels(index, "vllm")
    if not wheels:
        raise BuildNotFound(f"{index}vllm/ lists no vLLM nightly" + (f" for variant {runtime.variant!r}" if runtime.variant else ""))
    newest = max(w.version for w in wheels)
    commits = {_commit_of(w) for w in wheels if w.version == newest}
    commits.discard(None)
    if len(commits) != 1:
        raise BuildNotFound(
            f"{index}vllm/: cannot tell the commit of {newest} (its links name {sorted(commits) or 'no'} commit folders); "
            "pin the commit instead: nightly: <full sha>"
        )
    return str(newest), commits.pop()


def resolve(runtime, refresh: bool = False, lock: lockfile.LockFile | None = None,
            index_client: WheelIndex = SIMPLE_INDEX) -> Build:
    # lock: the run's lock file (RunContext.lock_file); None only where no `nightly: latest` is asked
    """The exact build for a VllmRuntime; raises BuildNotFound (what exists, why excluded) before any host changes.

    ``nightly: latest`` is read from the lock file unless ``refresh``; a fresh resolution is recorded.
    A wheelhouse install is resolved from the wheelhouse by uv on the host (offline), not here.
    """
    if runtime.wheelhouse and runtime.version is not None:
        return Build(runtime.package, runtime.version, "nightly" if runtime.nightly else "release",
                     commit=runtime.nightly if runtime.nightly not in (None, "latest") else None,
                     variant=runtime.variant, requested=runtime.version)
    if runtime.nightly is None:
        return kept_build(runtime, None, refresh, lambda: _resolve_release(runtime, index_client))
    if runtime.nightly != "latest":
        return kept_build(runtime, runtime.nightly, refresh,
                          lambda: _resolve_commit(runtime, runtime.nightly, f"nightly {runtime.nightly}", index_client))

    if lock is None:
        raise ValueError("vllm nightly latest needs the run's lock file (resolve.lockfile.LockFile)")
    key = f"vllm nightly {runtime.wheel_index} {runtime.variant or 'default'}"
    entry = lock.get(key)
    if entry is None or refresh:
        version, commit = latest_nightly(runtime, index_client)
        if entry is None or (entry.get("version"), entry.get("commit")) != (version, commit):
            entry = {"version": version, "commit": commit, "resolved_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            lock.record(key, entry)
    pinned = runtime.model_copy(update={"version": entry["version"]})
    return kept_build(pinned, entry["commit"], refresh,
                      lambda: _resolve_commit(pinned, entry["commit"], "nightly latest", index_client),
                      requested="nightly latest")


def kept_build(runtime, commit: str | None, refresh: bool, resolve_now, requested: str | None = None) -> Build:
    """An exact build's resolution, asked of its index once and kept (resolve/plancache.py), keyed on every
    field that chooses it: an exact version (or a full commit's build) on one index is the same build on every run.
    What the index answers that it has not is never kept (BuildNotFound is raised again next run)."""
    if commit is not None and not FULL_SHA.match(commit):
        return resolve_now()
    key = {"package": runtime.package, "version": runtime.version, "commit": commit, "variant": runtime.variant,
           "index_url": runtime.index_url, "wheel_index": runtime.wheel_index, "pypi": PYPI_SIMPLE,
           "requested": requested or (f"nightly {commit}" if commit else runtime.version)}
    return plancache.kept("vllm-build", key, resolve_now, refresh, encode=build_to_record, decode=build_from_record)


def build_to_record(build: Build) -> dict:
    return {**{name: getattr(build, name) for name in
               ("package", "version", "channel", "commit", "variant", "index_url", "requested")},
            "wheels": [[w.filename, w.url, str(w.version), w.sha256] for w in build.wheels]}


def build_from_record(record: dict) -> Build:
    wheels = tuple(Wheel(filename, url, Version(version), sha) for filename, url, version, sha in record["wheels"])
    return Build(**{k: v for k, v in record.items() if k != "wheels"}, wheels=wheels)


def build_requirements(build: Build, index_client: WheelIndex = SIMPLE_INDEX) -> tuple[str, ...] | None:
    """The build's Requires-Dist lines from its index's core metadata file (PEP 658: ``<wheel URL>.metadata``),
    or None when the index has none for it (then the venv's own check judges the host's packages)."""
    wheel = next((w for w in sorted(build.wheels, key=lambda w: "x86_64" not in w.filename)), None)
    if wheel is None:
        return None
    text = index_client.metadata(wheel)
    if text is None:
        return None
    return tuple(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:"))


def wheel_requirements(wheel) -> tuple[str, ...] | None:
    """Requires-Dist lines of a local wheel file (None for no file)."""
    import zipfile

    if wheel is None:
        return None
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(meta).decode()
    return tuple(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:"))


def install_options(build: Build) -> dict:
    """What a venv spec records about where and how the build is installed."""
    return {"index_url": build.index_url, "prerelease": build.prerelease, "index_strategy": "first-index"}


def to_json(build: Build) -> str:
    return json.dumps({"package": build.package, "version": build.version, "commit": build.commit,
                       "variant": build.variant, "index_url": build.index_url})


# ---------------------------------------------------------------- patch series preflight


class PatchDoesNotApply(ValueError):
    """A patch of the series does not apply to the build; raised at plan time, before any host changes."""


def patched_paths(text: str) -> list[str]:
    """The files a -p1 unified diff changes (``+++ b/vllm/x.py`` -> ``vllm/x.py``)."""
    paths = []
    for line in text.splitlines():
        if line.startswith("+++ "):
            target = line[4:].split("\t", 1)[0].strip()
            if target != "/dev/null":
                paths.append(target.split("/", 1)[1] if "/" in target else target)
    return paths


def build_wheel_file(build: Build, wheelhouse: str | None = None,
                     index_client: WheelIndex = SIMPLE_INDEX) -> "os.PathLike | None":
    """A local copy of the build's wheel: from a local wheelhouse, else downloaded once into the cache."""
    from pathlib import Path

    from packaging.utils import canonicalize_name

    if wheelhouse:
        for candidate in sorted(Path(wheelhouse).glob("*.whl")):
            try:
                name, version, _, _ = parse_wheel_filename(candidate.name)
            except (InvalidWheelFilename, InvalidVersion):
                continue
            if canonicalize_name(name) == canonicalize_name(build.package) and version == Version(build.version):
                return candidate
        return None
    if not build.wheels:
        return None
    # any of the build's wheels carries the same Python sources; prefer the host's usual platform
    wheel = sorted(build.wheels, key=lambda w: ("x86_64" not in w.filename and "none-any" not in w.filename, w.filename))[0]
    cache = Path(os.environ.get("HEAVYLIFT_CACHE", Path.home() / ".cache" / "heavylift")) / "wheels"
    local = cache / (wheel.sha256 or "unhashed") / wheel.filename
    if local.exists():
        return local
    import hashlib

    local.parent.mkdir(parents=True, exist_ok=True)
    partial = local.with_suffix(".partial")
    digest = hashlib.sha256()
    with index_client.open(wheel) as answer, open(partial, "wb") as out:
        while chunk := answer.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if wheel.sha256 and digest.hexdigest() != wheel.sha256:
        partial.unlink()
        raise PatchDoesNotApply(f"{wheel.url}: the download does not match the index's sha256")
    partial.rename(local)
    return local


def check_patch_series(build: Build, patch_files: list[str], wheelhouse: str | None = None,
                       index_client: WheelIndex = SIMPLE_INDEX) -> str:
    """Dry-run the whole series, in order, against the build's own files (from its wheel); raise naming patch, file, hunk.

    ``--fuzz=0``: GNU patch otherwise ignores up to two context lines (its default fuzz factor 2),
    so a patch written for one build would "apply" to another whose code differs right there.

    Returns what was checked (for the log); checks nothing when the wheel is not reachable from here
    (a wheelhouse only on the host), the host's own dry run then stops the install instead.
    """
    import subprocess
    import tempfile
    import zipfile
    from pathlib import Path

    if not patch_files:
        return "no patches"
    wheel = build_wheel_file(build, wheelhouse, index_client)
    if wheel is None:
        return "series not checked here: the build's wheel is only on the host"
    with tempfile.TemporaryDirectory(prefix="heavylift-patch-") as tree, zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for patch in patch_files:
            for path in patched_paths(Path(patch).read_text()):
                if path in names and not (Path(tree) / path).exists():
                    archive.extract(path, tree)
        for patch in patch_files:
            name = Path(patch).name
            result = subprocess.run(
                ["patch", "-p1", "--forward", "--batch", "--fuzz=0", "--dry-run", "-d", tree, "-i", str(Path(patch).resolve())],
                capture_output=True, text=True,
            )
            if result.returncode != 0:
                raise PatchDoesNotApply(f"patch {name} does not apply to {build.label()}: {_patch_failure(result.stdout + result.stderr)}")
            # apply for real in the scratch tree: the next patch of the series sees this one's result
            subprocess.run(["patch", "-p1", "--forward", "--batch", "--fuzz=0", "--silent", "-d", tree, "-i", str(Path(patch).resolve())],
                           capture_output=True, text=True, check=True)
    return f"{len(patch_files)} patches apply to {build.label()}"


def _patch_failure(output: str) -> str:
    """GNU patch's own words, reduced to: which file, which hunks, or that it is already applied."""
    current, problems = None, []
    for line in output.splitlines():
        match = re.match(r"^(?:checking|patching) file (.+)$", line) or re.match(r"^\|\+\+\+ [^/\s]+/(\S+)", line)
        if match:
            current = match.group(1).strip("'")
        elif "Reversed (or previously applied) patch detected" in line:
            problems.append(f"file {current}: already applied (the build contains this change; drop the patch)")
        elif re.match(r"^Hunk #\d+ FAILED", line):
            problems.append(f"file {current}: {line.strip().rstrip('.')}")
        elif "can't find file to patch" in line or "No file to patch" in line:
            problems.append(f"file {current or '?'}: not in this build")
    return "; ".join(dict.fromkeys(problems)) or output.strip().splitlines()[-1]
