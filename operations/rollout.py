"""The rollout's stages, one function each, each taking its part of the plan (resolve/plan.py).

deploy.py calls them in order; rollback.py calls the switch, service and gate stages with a rollback's plan
(resolve/rollback.py). They are plain functions, not pyinfra ``@deploy`` sub-deploys:
``@deploy`` prefixes the name of every operation inside it with the deploy's name (pyinfra 3.10
api/host.py ``Host.deploy``: ``f"{current_deploy_name} | {name}"``), which would rename every line of
the results table operators and the tests read.

Every stage only reads the plan; the host's facts it reads are those its operations need.
"""

from __future__ import annotations

import dataclasses
from io import StringIO
from pathlib import Path

from pydantic import SecretStr
from pyinfra import host, logger, state
from pyinfra.api import OperationError
from pyinfra.operations import files
from pyinfra.operations.util.files import generate_color_diff

from models.errors import HeavyliftConfigError
from models.validate import DataSources, load_deployment, origin_of
from resolve.context import RunContext
from resolve import nodes, sitesource as site_source_plan
from resolve.compat import CPU_PACKAGES, HostResources
from resolve.diskgc import SnapshotPlan, after_switch_only, plan_snapshots
from resolve.layout import Layout
from resolve.neighbours import check as check_neighbours
from resolve.plan import Plan, RefusedError, gpu_selection, make_plan

from . import checkpoint, diskgc, fleet, neighbours, permissions, readiness, release, runtime, secrets, service, sitesource, supervisor, waves, weights
from .gpu import NvidiaGpus, NvidiaGpuUse, NvidiaTopology
from .cpus import HostCpus
from .shm import DevShm

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def planned() -> tuple[Plan, RunContext]:
    """Validate and plan this host: the run's context (read once), the site's data, its secrets on the control
    machine, the host's facts (GPUs, the Python packages it lends, the neighbours) -> one frozen plan.

    Every refusal is a HeavyliftConfigError naming the file and field that set the value, before any host changes.
    """
    context = RunContext.of_pyinfra(state, host)
    sources = DataSources.of_run(context)

    def origin(key: str) -> str:
        return origin_of(host, key, sources).label

    # a bad key or value stops the run here (deploy.py takes no key of its own: command_keys none, so rollback.py's
    # --data release=... is refused as unknown); an unsupported model's refusal names each host's own GPUs
    deployment = load_deployment(host, sources=sources, gpus_of=lambda chosen: chosen.get_fact(NvidiaGpus).summary())
    context = dataclasses.replace(context, until=deployment.settings.until)
    where = f"host '{host.name}'"
    try:
        # the HF token and API key, read on the control machine (env:NAME or file:PATH), kept as SecretStr
        secret_env = secrets.resolve(deployment.settings)
    except secrets.SecretSourceError as error:
        raise HeavyliftConfigError(f"{origin(error.field)}, {where}: {error} No host was changed.") from None
    # one vLLM instance over several hosts: this host's rank and peers, worked out once for the whole group
    role = nodes.role_of(
        host, lambda other: load_deployment(other, sources=sources), lambda other, key: origin_of(other, key, sources).label
    )
    # weights fetched once per site: this host fetches from the Hub and serves, or copies from the source host
    site_source = site_source_plan.plan_for(deployment.settings, host.name, ssh_hostname_of)
    gpus = host.get_fact(NvidiaGpus)
    gpu_selection(deployment, gpus, f"{origin('gpus')}, {where}")
    # what the ranks need besides the GPUs (/dev/shm), the GPU memory others hold, how the GPUs are linked:
    # read with the facts above, in the same round trip (operations/factbatch.py)
    resources = host_resources(deployment, gpus)
    # a GPU image's own torch, reused by the venv (vllm.host_packages): what the host's Python has
    host_runtime = runtime.host_runtime(deployment.settings.vllm)
    runtime.check_wheelhouse(deployment.settings.vllm, f"{origin('vllm')}, {where}")
    # the other deployments on the host (their launchers) and the ports in use: no clash
    check_neighbours(deployment, host.name, gpus.count, origin, neighbours.read(deployment.settings.root))
    try:
        plan = make_plan(
            deployment, host.name, gpus, host_runtime, origin=origin, context=context, secrets=secret_env, role=role,
            site_source=site_source, host_resources=resources,
            init_system=supervisor.init_system(deployment.settings.service_manager),
        )
    except RefusedError as refusal:
        raise HeavyliftConfigError(
            f"{refusal.where or deployment.entry_file.name}: {where} ({gpus.summary()}): {refusal} No host was changed."
        ) from None
    return plan, context


def host_resources(deployment, gpus) -> HostResources:
    """/dev/shm (every host), the memory others hold on the GPUs (hosts with GPUs) and the GPU topology (hosts with
    several): the facts the tensor parallel preflights judge (resolve/compat.py, docs/tp-preflights.md)."""
    deployments_dir = Layout.of_host(deployment.settings.root).deployments_dir
    return HostResources(
        shm=host.get_fact(DevShm),
        gpu_use=host.get_fact(NvidiaGpuUse, deployments_dir=deployments_dir) if gpus.count else None,
        topology=host.get_fact(NvidiaTopology) if gpus.count > 1 else None,
        deployment=deployment.name,
        # vLLM's CPU build binds each rank to CPUs (rule cpu-tp-thread-bind); a GPU build does not need them
        cpus=host.get_fact(HostCpus) if deployment.settings.vllm.package in CPU_PACKAGES else None,
    )


def ssh_hostname_of(name: str) -> str | None:
    """The address pyinfra reaches an inventory host by (its ssh_hostname), None when unknown or unset."""
    other = host.inventory.get_host(name, None)
    return getattr(other.data, "ssh_hostname", None) if other is not None else None


def report_resolution(plan) -> None:
    """The rules that fired on this host, their warnings and notes (every run, also --dry)."""
    for rule in plan.resolution.fired:
        logger.info(f"{host.print_prefix}rule {rule.id}: {rule.title}: {'; '.join(rule.changes) or 'no change'}")
    for warning in plan.resolution.warnings:
        logger.warning(f"{host.print_prefix}{warning}")
    for note in plan.resolution.notes:
        logger.info(f"{host.print_prefix}note: {note}")


def runtime_converged(plan):
    """uv, the Hub client's venv, and the vLLM build's venv beside the active one, then the `venv` link.

    Returns the operations whose change makes a running vLLM stale."""
    layout, part = plan.layout, plan.runtime
    files.directory(name="heavylift folders", path=layout.deployment_dir)
    files.put(
        name="resolution (rules that fired, as JSON)",
        src=StringIO(plan.resolution_json()),
        dest=layout.resolution_file,
        # the folder comes from the operation above; pyinfra stops a dry run's change detection (and its
        # diff) at the first command, which would be the folder's mkdir on a fresh host (pyinfra 3.10
        # api/operation.py: `for _ in command_generator(): ... break`, files.put yields it before the diff)
        create_remote_dir=False,
    )
    runtime.uv(name=f"uv {part.uv_version}", path=layout.uv, version=part.uv_version, wheelhouse=part.wheelhouse_upload)
    runtime.venv(
        name="Hub client venv", path=part.hub_venv.path, spec=part.hub_venv.spec,
        uv_path=layout.uv, uv_cache=layout.uv_cache, check=part.hub_venv.check,
    )
    return list(runtime.vllm_runtime(layout, part))


@dataclasses.dataclass(frozen=True)
class DiskCheck:
    """The disk check of the weights, made while the run is prepared, before any stage adds an operation."""

    host_state: dict  # the host's deployments and snapshots (fleet.HostState, light)
    before: SnapshotPlan  # the snapshots no kept release needs, removed before the download
    refusal: str | None  # why the download cannot fit (host, checkpoint, needed and free figures), or None


def disk_checked(plan) -> DiskCheck:
    """Whether the snapshot's files still to fetch fit the host's disk, counting what the removal of old snapshots
    frees (resolve/diskgc.py). A refusal is the site's to act on (``when_disk_too_small``, ``refused``)."""
    part = plan.weights
    host_state = host.get_fact(fleet.HostState, root=plan.layout.root, light=True)
    before = plan_snapshots(host_state, plan.deployment, part.content_dir, part.keep_snapshots)
    try:
        weights.preflight(part.snapshot, part.content_dir, part.manifest, part.verify, part.disk_margin_gb,
                          freed_bytes=before.freed_bytes)
    except OperationError as error:
        return DiskCheck(host_state, before, str(error))
    return DiskCheck(host_state, before, None)


def refused(plan, check: DiskCheck, wave_plan) -> None:
    """A host whose disk cannot hold the checkpoint, as the site says (``when_disk_too_small``): ``hold`` ends
    the whole run here, while it is prepared, so no host changes; ``proceed`` leaves this host untouched (no
    lock, no operation but the one that fails it when the run executes) and keeps it from holding the waves of
    the others (operations/waves.py)."""
    if plan.weights.when_too_small != "proceed":
        raise OperationError(f"{check.refusal} Or set when_disk_too_small: proceed to let the other hosts go on "
                             "without this one. No host was changed.")
    logger.warning(f"{host.print_prefix}refused: {check.refusal}; this host is left untouched and fails, the others "
                   "go on (when_disk_too_small: proceed)")
    waves.excused(host, state, wave_plan, "its disk cannot hold the checkpoint")
    weights.refused(name="disk too small for the checkpoint: host left untouched", why=check.refusal)


def weights_present(plan, check: DiskCheck):
    """The pinned snapshot, downloaded on the host and verified into a manifest; old snapshots removed first
    (what ``check`` planned: ``disk_checked``).

    Returns the host's state and what the removal planned (the after-switch removal adds to it)."""
    if check.refusal:
        # a host whose disk cannot hold the checkpoint never downloads: deploy.py acts on the refusal before any
        # stage (``refused``); a deploy that calls this stage directly is refused here, while it is prepared
        raise OperationError(check.refusal)
    layout, part = plan.layout, plan.weights
    for script in weights.HOST_SCRIPTS:
        files.put(name=f"heavylift host script {script}", src=f"{weights.SCRIPTS_DIR}/{script}", dest=layout.script(script))
    files.directory(name="private folder (0700)", path=layout.private_dir, mode="700")
    token_file = None
    if part.token is not None:  # gated repos: the host's download needs the token too
        token_file = layout.hub_token_file
        # one line with its newline: pyinfra ends what it sends on stdin with one (a file without it
        # would never match and be written on every run)
        secrets.env_file(
            name="Hub token for downloads (0600, never shown)", path=token_file,
            content=SecretStr(part.token.get_secret_value() + "\n"),
        )
    # snapshots no kept release needs go first; the disk check counted what that frees
    host_state, before = check.host_state, check.before
    diskgc.snapshots_pruned(name="old snapshots (before the download)", plan=before)
    download = dict(
        snapshot=part.snapshot, local_dir=part.content_dir, manifest=part.manifest,
        python=f"{plan.runtime.hub_venv.path}/bin/python", script_dir=layout.scripts, endpoint=part.hf_endpoint,
        workers=part.workers, verify=part.verify, disk_margin_gb=part.disk_margin_gb, stall_seconds=part.stall_seconds,
        tries=part.tries, token_file=token_file, freed_bytes=before.freed_bytes,
    )
    name = f"weights {part.snapshot.repo}@{part.snapshot.commit[:12]}"
    source = part.site_source
    if source is None:
        weights.downloaded(name=name, **download)
        return host_state, before
    # a site source: its host fetches from the Hub and serves the verified snapshot; the others copy it from
    # there. pyinfra runs each operation on every host before the next, so the source's download and server
    # come first; `answering`, on every host, orders the copy after the server (operations/sitesource.py)
    sitesource.upload_scripts(layout, weights.SCRIPTS_DIR)
    started = None
    if source.fills_from_hub:
        weights.downloaded(name=name, **download)
        started = sitesource.serve(source, layout, plan.service.user, part.token, str(TEMPLATES), part.content_dir,
                                   plan.service.manager)
    sitesource.answering(name="site source answers", source=source, started=started)
    if not source.fills_from_hub:
        headers = sitesource.copy_token(layout, part.token)
        weights.downloaded(name=f"{name} from the site source {source.host}",
                           source=sitesource.fetch_source(source, headers), **download)
    return host_state, before


def overlay_rendered(plan):
    """Links to the pristine files plus the patched, rendered configs; with --diff also the overlay
    against the checkpoint's own files.

    Returns the operations whose change makes vLLM stale: none. As with the staging launcher (``release_staged``),
    the overlay is part of the release id (resolve/launcher.py ``release_id``) and each release runs its own copy
    of it: a new overlay is a new release, whose switch restarts vLLM; and after a release with a bad overlay was
    rolled back, writing the serving release's overlay back would restart a vLLM that already runs it."""
    layout, part, snapshot = plan.layout, plan.overlay, plan.weights.snapshot
    files.directory(name="overlay folder", path=layout.overlay)
    checkpoint.links(name="overlay links", path=layout.overlay, target_dir=plan.weights.content_dir,
                     names=list(part.link_names))
    for filename, text in part.rendered.items():
        files.template(
            name=f"overlay {filename}",
            src=str(TEMPLATES / f"{filename}.j2"),
            dest=layout.overlay_file(filename),
            # readable by the service user: pyinfra's @local connector keeps its temporary file's 0600
            mode="644",
            repo=snapshot.repo,
            commit=snapshot.commit,
            document=text.rstrip("\n"),
            create_remote_dir=False,  # the overlay folder above; see resolution.json
        )
    if state.config.DIFF:
        # what the rules and the catalog change in the checkpoint's own files, shown whether or not the host has
        # the overlay yet (its diff above is against the host's current file)
        for filename, text in part.rendered.items():
            changes = list(generate_color_diff(part.pristine[filename].splitlines(True), text.splitlines(True)))
            logger.info(
                f"{host.print_prefix}overlay {filename} against the pristine {snapshot.repo}@{snapshot.commit[:12]}:"
                + ("" if changes else " unchanged")
            )
            for line in changes:
                logger.info(f"  {line}")
    return []


def release_staged(plan):
    """The service user, the launcher and its secrets, and the release folder (venv, overlay, launcher).

    Returns the operations whose change makes vLLM stale: the secrets. The staging launcher is not one: its text
    is part of the release id (resolve/launcher.py release_id), so a new text is a new release, whose switch
    restarts vLLM; and after a failed upgrade was rolled back it still holds the failed release's text, so
    writing the serving release's back would restart a vLLM that already runs it."""
    layout, part, user = plan.layout, plan.release, plan.service.user
    files.put(name="readiness probe script", src=str(SCRIPTS / readiness.PROBE_SCRIPT), dest=layout.probe_script)
    service.service_user(name=f"service user {user}", user=user, home=layout.service_home)
    # the one folder the service may write (vLLM and torch caches); root owns everything else
    files.directory(name="service user home", path=layout.service_home, user=user, group=user, mode="750")
    files.put(name="vLLM launcher", src=StringIO(part.launcher_text), dest=layout.launcher, mode="755",
              create_remote_dir=False)  # the deployment folder, made first; see resolution.json
    env_file = secrets.env_file(
        name="vLLM secrets (0600, never shown)",
        path=layout.env_file,
        content=SecretStr(secrets.render_env_file(str(TEMPLATES / "serve.env.j2"), plan.deployment, part.secrets)),
    )
    files.directory(name="releases folder", path=layout.releases)
    release.staged(
        name=f"release {part.id}", release_dir=layout.release(part.id),
        launcher=layout.launcher, overlay=layout.overlay, venv=plan.runtime.vllm_venv.path, model_link=part.model_link,
    )
    return [env_file]


def readable(plan) -> None:
    """A hardened host's umask (027, 077) makes all of it root-only; the service reads these as its own user."""
    layout = plan.layout
    permissions.readable_by_service(
        name="readable by the service user",
        trees=[plan.weights.content_dir, layout.release(plan.release.id), layout.scripts],
        root=layout.root,
        # opened by runtime.venv when it was built (a venv is never changed after)
        opened_when_built=[plan.runtime.vllm_venv.path],
    )


def release_switched(plan, host_state=None, before=None):
    """`current` -> the plan's release (`previous` -> the one before; a deploy's or a rollback's plan). In a deploy
    (``host_state`` and the snapshot removal planned ``before`` the download given) what only the switch frees
    goes after it; a rollback removes nothing."""
    layout, switch = plan.layout, plan.switch
    switched = release.current(name=switch.label, deployment_dir=layout.deployment_dir, release=switch.release,
                               keep=switch.keep)
    if before is not None:
        # what was `previous` until this switch (and releases beyond keep_snapshots) may go now
        part = plan.weights
        diskgc.snapshots_pruned(name="old snapshots (after the switch)", plan=after_switch_only(
            before, plan_snapshots(host_state, plan.deployment, part.content_dir, part.keep_snapshots,
                                   new_release=switch.release, after_switch=True)))
    return switched


def service_running(plan, stale_when_changed):
    """systemd's unit or the start-stop-daemon fallback runs <deployment>/current/serve as the service user,
    restarted only when something it runs changed; a rollback's (``restart_only``) is restarted as the deploy
    left it, when its switch changed. Returns (supervisor, its operation)."""
    part = plan.service
    chosen = supervisor.of(plan.layout, part.manager, part.user, part.stop_grace)
    if part.restart_only:
        return chosen, supervisor.restarted(
            name=f"service restart ({chosen.manager})", commands=chosen.restart, dependencies=stale_when_changed,
            why=f"release {plan.switch.release} is current already",
        )
    return chosen, chosen.converged(plan, stale_when_changed)


def gate_passed(plan, chosen, dependencies) -> dict:
    """The readiness gate after every (re)start: /health, a completion, a short decode benchmark; figures
    into status.json and the report line; a failed gate rolls back to the previous release.
    Returns the gate's arguments (a failed wave's rollback gates the same way: operations/waves.py)."""
    layout, gate = plan.layout, plan.gate
    arguments = dict(
        url=gate.url,
        model=gate.model,
        endpoint=gate.endpoint,
        budget_seconds=gate.budget_seconds,
        log_command=chosen.log_command,
        gate=readiness.Gate(
            probe_script=layout.probe_script, pid_source=chosen.pid_source, env_file=layout.env_file,
            status_file=layout.status_file, benchmark_tokens=gate.benchmark_tokens, meta=gate.meta,
            group=plan.group, log_source=chosen.log_source,
        ),
        dependencies=dependencies,
        rollback=readiness.Rollback(
            current_link=layout.current, previous_link=layout.previous, releases_dir=layout.releases,
            restart=chosen.restart,
        ),
    )
    readiness.serving(name="vLLM ready", **arguments)
    return arguments


def wave_rolled_back(wave_plan, wave, switched, gate_arguments) -> None:
    """In a rollout in waves, a host whose wave-mate failed its gate goes back with it (operations/waves.py)."""
    if wave is not None:
        waves.rolled_back_with_wave(name="rolled back with its wave", plan=wave_plan, index=wave, switched=switched,
                                    **gate_arguments)
