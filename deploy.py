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
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import StringCommand, QuoteString
from pyinfra.operations import files

from models.errors import HeavyliftConfigError
from models.validate import load_deployment
from operations import checkpoint, readiness, runtime, service, weights
from operations.gpu import NvidiaGpus
from operations.plan import RefusedError, argument_lines, make_plan, quoted

# 1. validate: a bad key or value stops the run here, before any host changes
deployment = load_deployment(host)

# 2. resolve: pinned revision (lock file), file list, the host's GPUs x the model's features x the
#    vLLM version through the compatibility rules -> patched configs, vLLM arguments, or a refusal
gpus = host.get_fact(NvidiaGpus)
try:
    plan = make_plan(deployment, host.name, gpus)
except RefusedError as refusal:
    raise HeavyliftConfigError(
        f"{deployment.entry_file.name}: host '{host.name}' ({gpus.summary()}): {refusal} No host was changed."
    ) from None
layout = plan.layout
for rule in plan.resolution.fired:
    logger.info(f"{host.print_prefix}rule {rule.id}: {rule.title}: {'; '.join(rule.changes) or 'no change'}")
for warning in plan.resolution.warnings:
    logger.warning(f"{host.print_prefix}{warning}")

# 3. runtime: uv, then a venv per build that is never changed after it is checked
files.directory(name="heavylift folders", path=layout.deployment_dir)
files.put(
    name="resolution (rules that fired, as JSON)",
    src=StringIO(json.dumps({"gpus": gpus.to_json(), **plan.resolution.to_json()}, indent=2, sort_keys=True) + "\n"),
    dest=f"{layout.deployment_dir}/resolution.json",
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

# 4. weights: the pinned snapshot, downloaded on the host and verified into a manifest
for script in weights.HOST_SCRIPTS:
    files.put(
        name=f"heavylift host script {script}",
        src=f"{weights.SCRIPTS_DIR}/{script}",
        dest=f"{layout.scripts}/{script}",
    )
content_dir = layout.content(plan.snapshot.repo, plan.snapshot.commit)
manifest = layout.manifest(plan.snapshot.repo, plan.snapshot.commit)
# the disk check, at prepare time: a download that cannot fit stops the run before any host changes
weights.preflight(plan.snapshot, content_dir, manifest, deployment.settings.verify, deployment.settings.disk_margin_gb)
weights.downloaded(
    name=f"weights {plan.snapshot.repo}@{plan.snapshot.commit[:12]}",
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
        repo=plan.snapshot.repo,
        commit=plan.snapshot.commit,
        document=text.rstrip("\n"),
    )
    for filename, text in plan.rendered.items()
]

# 6. service: one launcher for both systemd and the fallback supervisor
launcher = files.template(
    name="vLLM launcher",
    src=str(TEMPLATES / "serve.sh.j2"),
    dest=layout.launcher,
    mode="755",
    deployment=plan.deployment,
    repo=plan.snapshot.repo,
    commit=plan.snapshot.commit,
    env_file=layout.env_file,
    command_lines=argument_lines(plan.launcher_args),
)
files.directory(name="private folder (0700)", path=layout.private_dir, mode="700")
env_file = files.template(
    name="vLLM environment",
    src=str(TEMPLATES / "serve.env.j2"),
    dest=layout.env_file,
    mode="600",
    deployment=plan.deployment,
    env={key: quoted([value])[0] for key, value in plan.env.items()},
)
stale_when_changed = [vllm_venv, active_venv, overlay_links, *rendered_configs, launcher, env_file]

manager = deployment.settings.service_manager
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
        env_file=layout.env_file,
        launcher=layout.launcher,
        timeout_start=plan.readiness_timeout,
    )
    service.systemd_unit(
        name=f"service {layout.unit_name}", unit=layout.unit_name,
        dependencies=[*stale_when_changed, unit_file], unit_file_op=unit_file,
    )
    log_command = StringCommand("journalctl", "-u", QuoteString(layout.unit_name), "-n", "40", "--no-pager")
    pidfile = None  # systemd restarts a crashed unit itself (Restart=on-failure)
else:
    service.daemon(
        name="service (start-stop-daemon)", launcher=layout.launcher, env_file=layout.env_file,
        pidfile=layout.pidfile, logfile=layout.logfile, dependencies=stale_when_changed,
    )
    log_command = StringCommand("tail", "-n", "40", QuoteString(layout.logfile))
    pidfile = layout.pidfile

# 7. readiness: /health, then one real completion; prints the endpoint
readiness.serving(
    name="vLLM ready",
    url=plan.probe_url,
    model=plan.served_model_name,
    endpoint=plan.endpoint,
    budget_seconds=plan.readiness_timeout,
    log_command=log_command,
    pidfile=pidfile,
)
