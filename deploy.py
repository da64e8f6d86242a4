"""heavylift: bring a model up with vLLM on every host of the inventory.

    pyinfra inventory/<site>.py deploy.py              converge
    pyinfra inventory/<site>.py deploy.py --dry --diff show what would change

The rollout, top to bottom: validate -> resolve -> runtime -> weights -> checkpoint
overlay -> service -> readiness. One call per step into operations/.
"""


import sys
from pathlib import Path

# models/ and operations/ live beside this file, wherever pyinfra is started from
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
TEMPLATES = HERE / "templates"

import json
import shlex
from io import StringIO

from pydantic import SecretStr
from pyinfra import host, logger, state
from pyinfra.api import StringCommand, QuoteString
from pyinfra.api.util import get_template
from pyinfra.operations import files, server
from pyinfra.operations.util.files import generate_color_diff

from models.errors import HeavyliftConfigError
from models.validate import DataSources, load_deployment, origin_of


def data_origin(host, key):
    """The file (or --data) a host's data key came from, for messages."""
    return origin_of(host, key, DataSources.from_cli()).label
from operations import checkpoint, diskgc, fleet, hostlock, neighbours, permissions, readiness, release, runtime, secrets, service, sitesource, weights
from operations.gpu import NvidiaGpus
from resolve.plan import RefusedError, make_plan

# 1. validate: a bad key or value stops the run here, before any host changes; an unsupported model's
#    refusal names each host's own GPUs (a fact read, no change)
deployment = load_deployment(host, gpus_of=lambda chosen: chosen.get_fact(NvidiaGpus).summary())
try:
    # the HF token and API key, read on the control machine (env:NAME or file:PATH), kept as SecretStr
    secret_env = secrets.resolve(deployment.settings)
except secrets.SecretSourceError as error:
    raise HeavyliftConfigError(f"{data_origin(host, error.field)}, host '{host.name}': {error} No host was changed.") from None

# 2. resolve: pinned revision (lock file), file list, the host's GPUs x the model's features x the
#    vLLM version through the compatibility rules -> patched configs, vLLM arguments, or a refusal
gpus = host.get_fact(NvidiaGpus)
# the site's GPU selection against tensor parallelism and the host's GPUs, before any change
cuda_devices = service.gpu_selection(deployment, gpus, f"{data_origin(host, 'gpus')}, host '{host.name}'")
# a GPU image's own torch, reused by the venv (vllm.host_packages): what the host's Python has, for the
# check of the build's torch pin before any change
host_runtime = runtime.host_runtime(deployment.settings.vllm)
runtime.check_wheelhouse(deployment.settings.vllm, f"{data_origin(host, 'vllm')}, host '{host.name}'")
# the other deployments on the host (their launchers) and the ports in use: no clash, before any change
neighbours.check(deployment, host.name, gpus.count, lambda key: data_origin(host, key))
try:
    plan = make_plan(deployment, host.name, gpus, host_runtime, origin=lambda key: data_origin(host, key))
except RefusedError as refusal:
    raise HeavyliftConfigError(
        f"{refusal.where or deployment.entry_file.name}: host '{host.name}' ({gpus.summary()}): {refusal} No host was changed."
    ) from None
layout = plan.layout
for rule in plan.resolution.fired:
    logger.info(f"{host.print_prefix}rule {rule.id}: {rule.title}: {'; '.join(rule.changes) or 'no change'}")
for warning in plan.resolution.warnings:
    logger.warning(f"{host.print_prefix}{warning}")
for note in plan.resolution.notes:
    logger.info(f"{host.print_prefix}note: {note}")

# one run at a time per host: a second run stops here, naming the holder (operations/hostlock.py)
# pyinfra keeps no record of --dry where deploy code sees it; a dry run only looks at the lock
lock_said = hostlock.hold(host, state, plan.layout.lock, dry="--dry" in sys.argv)
if lock_said.startswith(("recovered", "another run")):
    logger.warning(f"{host.print_prefix}{lock_said}")

# 3. runtime: uv, then a venv per build that is never changed after it is checked
files.directory(name="heavylift folders", path=layout.deployment_dir)
files.put(
    name="resolution (rules that fired, as JSON)",
    src=StringIO(json.dumps({"gpus": gpus.to_json(), **plan.resolution.to_json()}, indent=2, sort_keys=True) + "\n"),
    dest=f"{layout.deployment_dir}/resolution.json",
    # the folder comes from the operation above; pyinfra stops a dry run's change detection (and its
    # diff) at the first command, which would be the folder's mkdir on a fresh host (pyinfra 3.10
    # api/operation.py: `for _ in command_generator(): ... break`, files.put yields it before the diff)
    create_remote_dir=False,
)
runtime.uv(name=f"uv {plan.uv_version}", path=layout.uv, version=plan.uv_version,
           wheelhouse=deployment.settings.vllm.wheelhouse_upload)
hub_venv = runtime.venv(
    name="Hub client venv", path=plan.hub_venv.path, spec=plan.hub_venv.spec,
    uv_path=layout.uv, uv_cache=layout.uv_cache, check=plan.hub_venv.check,
)
# the exact build (resolved at plan time) in its own venv, built and checked beside the active one,
# then the switch of the deployment's `venv` link; old venvs beyond keep_venvs are removed
vllm_venv, active_venv = runtime.vllm_runtime(deployment, layout, plan.build, plan.vllm_venv)

# 4. weights: the pinned snapshot, downloaded on the host and verified into a manifest; with a site
#    source, downloaded from the Hub by that host only, which serves it to the others (operations/sitesource.py)
site_source = sitesource.plan_for(deployment, host)
for script in weights.HOST_SCRIPTS:
    files.put(
        name=f"heavylift host script {script}",
        src=f"{weights.SCRIPTS_DIR}/{script}",
        dest=f"{layout.scripts}/{script}",
    )
content_dir = layout.content(plan.snapshot.repo, plan.snapshot.commit)
manifest = layout.manifest(plan.snapshot.repo, plan.snapshot.commit)
files.directory(name="private folder (0700)", path=layout.private_dir, mode="700")
hub_token_file = None
if "HF_TOKEN" in secret_env:  # gated repos: the host's download needs the token too
    hub_token_file = layout.hub_token_file
    # one line with its newline: pyinfra ends what it sends on stdin with one (a file without it
    # would never match and be written on every run)
    secrets.env_file(
        name="Hub token for downloads (0600, never shown)", path=hub_token_file,
        content=SecretStr(secret_env["HF_TOKEN"].get_secret_value() + "\n"),
    )
# snapshots no kept release needs go first, and the disk check counts what that frees (operations/diskgc.py)
host_state = host.get_fact(fleet.HostState, root=layout.root, light=True)
snapshots_before = diskgc.plan_snapshots(host_state, plan.deployment, content_dir, deployment.settings.keep_snapshots)
diskgc.snapshots_pruned(name="old snapshots (before the download)", plan=snapshots_before)
# the disk check, at prepare time: a download that cannot fit stops the run before any host changes
weights.preflight(plan.snapshot, content_dir, manifest, deployment.settings.verify, deployment.settings.disk_margin_gb,
                  freed_bytes=snapshots_before.freed_bytes)
weights_args = dict(
    snapshot=plan.snapshot,
    local_dir=content_dir,
    manifest=manifest,
    python=f"{plan.hub_venv.path}/bin/python",
    script_dir=layout.scripts,
    endpoint=plan.hf_endpoint,
    workers=plan.download_workers,
    verify=deployment.settings.verify,
    disk_margin_gb=deployment.settings.disk_margin_gb,
    stall_seconds=deployment.settings.download_stall_seconds,
    tries=deployment.settings.download_tries,
    token_file=hub_token_file,
    freed_bytes=snapshots_before.freed_bytes,
)
if site_source is not None:
    sitesource.upload_scripts(layout, weights.SCRIPTS_DIR)
if site_source is None or site_source.fills_from_hub:
    weights.downloaded(name=f"weights {plan.snapshot.repo}@{plan.snapshot.commit[:12]}", **weights_args)
# pyinfra runs each operation on every host before the next: the source's download and server come first
source_service = None
if site_source is not None and site_source.fills_from_hub:
    source_service = sitesource.serve(site_source, layout, deployment.settings, secret_env, str(TEMPLATES), content_dir,
                                      service.manager_of(deployment.settings.service_manager))
if site_source is not None:  # on every host: orders the others' copy after the source's server
    sitesource.answering(name="site source answers", source=site_source, started=source_service)
if site_source is not None and not site_source.fills_from_hub:
    source_headers = sitesource.copy_token(layout, secret_env)
    weights.downloaded(
        name=f"weights {plan.snapshot.repo}@{plan.snapshot.commit[:12]} from the site source {site_source.host}",
        source=sitesource.fetch_source(site_source, source_headers), **weights_args,
    )

# 5. checkpoint overlay: links to the pristine files plus the patched, rendered configs
files.directory(name="overlay folder", path=layout.overlay)
overlay_links = checkpoint.links(
    name="overlay links", path=layout.overlay, target_dir=content_dir, names=plan.link_names,
)
rendered_configs = [
    files.template(
        name=f"overlay {filename}",
        src=str(TEMPLATES / f"{filename}.j2"),
        dest=f"{layout.overlay}/{filename}",
        # readable by the service user: pyinfra's @local connector keeps its temporary file's 0600
        mode="644",
        repo=plan.snapshot.repo,
        commit=plan.snapshot.commit,
        document=text.rstrip("\n"),
        create_remote_dir=False,  # the overlay folder above; see resolution.json
    )
    for filename, text in plan.rendered.items()
]
if state.config.DIFF:
    # what the rules and the catalog change in the checkpoint's own files, shown whether or not the host has
    # the overlay yet (its diff above is against the host's current file)
    for filename, text in plan.rendered.items():
        changes = list(generate_color_diff(plan.pristine[filename].splitlines(True), text.splitlines(True)))
        logger.info(
            f"{host.print_prefix}overlay {filename} against the pristine {plan.snapshot.repo}@{plan.snapshot.commit[:12]}:"
            + ("" if changes else " unchanged")
        )
        for line in changes:
            logger.info(f"  {line}")

# 6. service: a release (venv, overlay, launcher) switched in by a link; systemd or the fallback
#    supervisor runs <deployment>/current/serve as the service user; restart only on change
settings = deployment.settings
user = settings.service_user
files.put(name="readiness probe script", src=str(HERE / "operations" / "scripts" / readiness.PROBE_SCRIPT),
          dest=layout.probe_script)
server.user(name=f"service user {user}", user=user, system=True, home=layout.service_home,
            shell="/usr/sbin/nologin", ensure_home=False)
# the one folder the service may write (vLLM and torch caches); root owns everything else
files.directory(name="service user home", path=layout.service_home, user=user, group=user, mode="750")
launcher_env = dict(plan.env)
if cuda_devices is not None:
    launcher_env["CUDA_VISIBLE_DEVICES"] = cuda_devices
launcher_text = get_template(str(TEMPLATES / "serve.sh.j2")).render(
    deployment=plan.deployment,
    repo=plan.snapshot.repo,
    commit=plan.snapshot.commit,
    env_file=layout.env_file,
    relative=True,
    env_lines=[f"{key}={shlex.quote(value)}" for key, value in sorted(launcher_env.items())],
    command_lines=release.launcher_lines(
        [*plan.launcher_args, "--shutdown-timeout", str(settings.shutdown_timeout)],
        {layout.active_venv: "venv", layout.overlay: "overlay"},
    ),
)
release_id = release.release_id(
    plan.vllm_venv.path, launcher_text,
    {"content": content_dir, "rendered": plan.rendered, "links": plan.link_names},
)
launcher = files.put(name="vLLM launcher", src=StringIO(launcher_text), dest=layout.launcher, mode="755",
                     create_remote_dir=False)  # the deployment folder, made first; see resolution.json
env_file = secrets.env_file(
    name="vLLM secrets (0600, never shown)",
    path=layout.env_file,
    content=SecretStr(secrets.render_env_file(str(TEMPLATES / "serve.env.j2"), plan.deployment, secret_env)),
)
files.directory(name="releases folder", path=layout.releases)
release.staged(
    name=f"release {release_id}", release_dir=layout.release(release_id),
    launcher=layout.launcher, overlay=layout.overlay, venv=plan.vllm_venv.path,
)
switched = release.current(name="current release", deployment_dir=layout.deployment_dir, release=release_id)
# what was `previous` until this switch (and releases beyond keep_snapshots) may go now
diskgc.snapshots_pruned(name="old snapshots (after the switch)", plan=diskgc.after_switch_only(
    snapshots_before, diskgc.plan_snapshots(host_state, plan.deployment, content_dir, settings.keep_snapshots,
                                            new_release=release_id, after_switch=True)))
# a hardened host's umask (027, 077) makes all of it root-only; the service reads these as its own user
permissions.readable_by_service(
    name="readable by the service user",
    trees=[plan.vllm_venv.path, content_dir, layout.release(release_id), layout.scripts],
    root=layout.root,
)
stale_when_changed = [vllm_venv, active_venv, overlay_links, *rendered_configs, launcher, env_file, switched]
stop_grace = settings.shutdown_timeout + 30  # vLLM drains for --shutdown-timeout, then exits

manager = settings.service_manager
if manager == "auto":
    manager = "systemd" if host.get_fact(service.InitSystem) == "systemd" else "fallback"
if manager == "systemd":
    unit_file = files.template(
        name="systemd unit",
        src=str(TEMPLATES / "vllm.service.j2"),
        dest=layout.unit_path,
        deployment=plan.deployment,
        repo=plan.snapshot.repo,
        commit=plan.snapshot.commit,
        service_user=user,
        env_file=layout.env_file,
        launcher=layout.service_launcher,
        probe_script=layout.probe_script,
        health_url=plan.probe_url,
        timeout_start=settings.start_timeout or plan.readiness_timeout,
        timeout_stop=stop_grace,
        restart_sec=settings.restart_delay,
        restart_backoff=host.get_fact(service.SystemdVersion) >= service.RESTART_BACKOFF_SINCE,
        restart_max_delay=settings.restart_max_delay,
        limit_nofile=settings.limit_nofile,
    )
    service_op = service.systemd_unit(
        name=f"service {layout.unit_name}", unit=layout.unit_name,
        dependencies=[*stale_when_changed, unit_file], unit_file_op=unit_file,
        release=release_id, releases_dir=layout.releases,
    )
    log_command = StringCommand("journalctl", "-u", QuoteString(layout.unit_name), "-n", "40", "--no-pager")
    pid_source = f"systemd:{layout.unit_name}"
    restart = service.systemd_restart(layout.unit_name)
else:
    service_op = service.daemon(
        name="service (start-stop-daemon)", launcher=layout.service_launcher, env_file=layout.env_file,
        pidfile=layout.pidfile, logfile=layout.logfile, dependencies=stale_when_changed,
        grace_seconds=stop_grace, user=user, home=layout.service_home,
        release=release_id, releases_dir=layout.releases,
    )
    log_command = StringCommand("tail", "-n", "40", QuoteString(layout.logfile))
    pid_source = f"pidfile:{layout.pidfile}"
    restart = service.daemon_restart(
        layout.service_launcher, layout.env_file, layout.pidfile, layout.logfile, stop_grace, user, layout.service_home,
    )

# 7. readiness gate after every (re)start: /health, a completion, a short decode benchmark;
#    figures into status.json and the report line; a failed gate rolls back to the previous release
readiness.serving(
    name="vLLM ready",
    url=plan.probe_url,
    model=plan.served_model_name,
    endpoint=plan.endpoint,
    budget_seconds=plan.readiness_timeout,
    log_command=log_command,
    gate=readiness.Gate(
        probe_script=layout.probe_script,
        pid_source=pid_source,
        env_file=layout.env_file,
        status_file=layout.status_file,
        benchmark_tokens=settings.benchmark_tokens,
        meta={
            "deployment": plan.deployment,
            "release": release_id,
            # the exact build planning resolved (a nightly has no version in the settings)
            "vllm": f"{settings.vllm.package} {plan.build.version}",
            "model": f"{plan.snapshot.repo}@{plan.snapshot.commit}",
            "endpoint": plan.endpoint,
        },
    ),
    dependencies=[*stale_when_changed, service_op],
    rollback=readiness.Rollback(
        current_link=layout.current, previous_link=layout.previous, releases_dir=layout.releases, restart=tuple(restart),
    ),
)

# the lock is given back at the end of the run (and by a host whose operation failed, at once):
# only a run that died leaves it for the next one to recover
hostlock.released(name="deploy lock given back", path=layout.lock)
