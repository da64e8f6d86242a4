"""Site source: the checkpoint fetched from the Hub once per site, then copied host to host over the LAN.

One host of the site (``site_source.host``) fetches the pinned snapshot from the Hub (or
``hf_endpoint``) as every host does without a site source, verifies it into its manifest, and
serves it with ``site_source_server.py``, a Hub-compatible endpoint that serves only files a
manifest vouches for, supervised like vLLM (a systemd unit, or start-stop-daemon where the host
has no systemd). Every other host copies the snapshot from there with ``site_fetch.py`` (parallel
``curl --continue-at -`` into the partial files fetch_weights.py resumes, hashed while they are
written) and verifies it against the Hub's listing (sizes, the Hub's sha256 where it gives one,
else the source's) before it writes its own manifest.

The order comes from pyinfra: it runs each operation on every host before the next one (pyinfra 3.10
``api/operations.py`` ``run_ops``: ``for op_hash in state.get_op_order(): _run_single_op(...)``,
unless ``--no-wait`` or ``--serial``), so the source's Hub download and its server come before the
others' copy. A copy that finds the source without the snapshot (``--limit`` left it out, its own
download failed, ``--no-wait``) waits ``site_source.wait_seconds`` for it, then fails naming the source.
"""

from __future__ import annotations

import shlex
from io import StringIO

from pydantic import SecretStr
from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.api.util import get_template
from pyinfra.operations import files

from resolve.address import local_url
from resolve.sitesource import SourcePlan
from resolve.supervisor import SYSTEMD

from . import permissions, secrets, service

SERVER_SCRIPT = "site_source_server.py"
FETCH_SCRIPT = "site_fetch.py"
HOST_SCRIPTS = (SERVER_SCRIPT, FETCH_SCRIPT)
TOKEN_ENV = "HEAVYLIFT_SITE_SOURCE_TOKEN"  # site_source_server.py reads the token from its environment


def fetch_source(source: SourcePlan, headers: str | None) -> dict:
    """The ``source`` of weights.downloaded on a copying host (site_fetch.py reads it from the request)."""
    return {"url": source.url, "name": source.host, "header_file": headers, "wait_seconds": source.wait_seconds}


def upload_scripts(layout, scripts_dir: str):
    for script in HOST_SCRIPTS:
        files.put(name=f"heavylift host script {script}", src=f"{scripts_dir}/{script}", dest=layout.script(script))


def copy_token(layout, token: SecretStr | None) -> str | None:
    """On a copying host: the header file with the site's token (the deployment's hf_token), or None."""
    if token is None:
        return None
    path = layout.site_source_headers
    secrets.env_file(
        name="site source token for the copy (0600, never shown)", path=path,
        content=SecretStr(f"Authorization: Bearer {token.get_secret_value()}\n"),
    )
    return path


def serve(source: SourcePlan, layout, user: str, token: SecretStr | None, templates: str, content_dir: str, manager: str):
    """On the source host: the site source's server running as the service user under systemd or
    start-stop-daemon (``manager``, the plan's: resolve/supervisor.py), restarted when its script, launcher,
    token or unit changed. Returns the service operation, for ``answering``, which every host calls next."""
    paths = layout.site_source
    # vLLM's stage makes these later; the server needs them first (both operations no-op the second time)
    service.service_user(name=f"service user {user}", user=user, home=layout.service_home)
    files.directory(name="site source folders", path=paths.run_dir)
    files.directory(name="site source private folder (0700)", path=paths.private_dir, mode="700")
    # the snapshot, its manifest (what the server reads first) and the server's script; a hardened
    # host's umask makes them root-only (operations/permissions.py)
    permissions.readable_by_service(
        name="site source files readable by the service user",
        trees=[content_dir, content_dir + ".manifest.json", layout.scripts], root=layout.root,
    )
    script = layout.script(SERVER_SCRIPT)
    launcher_text = get_template(f"{templates}/site-source.sh.j2").render(
        server_quoted=shlex.quote(script), models=paths.models, models_quoted=shlex.quote(paths.models),
        bind=source.bind_address, bind_quoted=shlex.quote(source.bind_address), port=source.port,
    )
    launcher = files.put(name="site source launcher", src=StringIO(launcher_text), dest=paths.launcher, mode="755")
    env = {TOKEN_ENV: token} if token is not None else {}
    env_text = (
        "# the site source's token (templates/site-source.sh.j2 reads it from the environment); root, 0600\n"
        + "".join(f"{name}={shlex.quote(value.get_secret_value())}\n" for name, value in env.items())
    )
    env_file = secrets.env_file(name="site source token (0600, never shown)", path=paths.env_file,
                                content=SecretStr(env_text))
    dependencies = [launcher, env_file]
    if manager == SYSTEMD:
        unit_file = files.template(
            name="site source systemd unit", src=f"{templates}/site-source.service.j2", dest=paths.unit_path,
            models=paths.models, bind=source.bind_address, port=source.port, service_user=user,
            env_file=paths.env_file, launcher=paths.launcher,
        )
        running = service.systemd_unit(name=f"site source service {paths.unit_name}", unit=paths.unit_name,
                                       dependencies=[*dependencies, unit_file], unit_file_op=unit_file)
    else:
        running = service.daemon(
            name="site source service (start-stop-daemon)", launcher=paths.launcher, env_file=paths.env_file,
            pidfile=paths.pidfile, logfile=paths.logfile, dependencies=dependencies, grace_seconds=10,
            user=user, home=layout.service_home,
        )
    return running


@operation()
def answering(source: SourcePlan, started=None, seconds: int = 30):
    """
    The site source's server answers its health check, waited for on the source after a (re)start in
    this run. Called on every host from one place: pyinfra 3.10 orders the operations of different
    hosts by a topological sort of each host's own sequence (``State.get_op_order``), so an
    operation the others do not share could run before the source's server; this one, shared by
    all, comes after the server on the source and before the copy on the others.

    + source: the host's part of the site source (``plan_for``)
    + started: the service operation on the source host (None on the others)
    + seconds: how long to wait
    """
    if not source.fills_from_hub:
        host.noop(f"the site source {source.host} fetched and serves before this host copies")
        return
    url = local_url(source.bind_address, source.port)
    if not service.changed_in_this_run([started]):
        host.noop(f"the site source at {url} was running already and nothing it depends on changed")
        return
    health = f"{url}/heavylift/health"
    yield StringCommand(
        "i=0;", "until", "curl", "--silent", "--fail", "--output", "/dev/null", "--max-time", "2", QuoteString(health), ";",
        "do", "i=$((i+1));", "if", "[", "$i", "-ge", str(seconds * 10), "];", "then",
        "echo", QuoteString(f"the site source does not answer at {health} after {seconds} s"), ">&2;", "exit", "1;",
        "fi;", "sleep", "0.1;", "done",
    )
