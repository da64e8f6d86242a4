"""Where heavylift keeps things on a host: one place that names every path.

Everything else asks a ``Layout``: the stages (operations/rollout.py), the operator commands (status.py,
rollback.py, retire.py), the site source, and the host scripts, which get their paths as arguments
(``host_state_paths`` for scripts/host_state.py).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass


def spec_id(spec: dict) -> str:
    """A short content address for a spec: same spec, same folder; any change, a new one."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


# the site's ``root`` when it sets none (models/schema.py SiteSettings.root)
DEFAULT_ROOT = "/opt/heavylift"
SYSTEMD_UNITS = "/etc/systemd/system"
# stand for a deployment's name, a release id and a snapshot's repo and commit in the paths scripts/host_state.py
# is given (it finds the deployments, releases and snapshots itself)
NAME, RELEASE, REPO, COMMIT = "{name}", "{release}", "{repo}", "{commit}"


@dataclass(frozen=True)
class Layout:
    root: str
    deployment: str = ""  # empty: the host's paths only (status.py, retire.py before they know a deployment)
    uv_cache_dir: str | None = None

    @classmethod
    def of_host(cls, root: str | None) -> Layout:
        """The host's paths under the site's ``root``, the default where the site sets none."""
        return cls(root or DEFAULT_ROOT)

    def of(self, deployment: str) -> Layout:
        """The same host's paths for one deployment."""
        return Layout(self.root, deployment, self.uv_cache_dir)

    @property
    def uv(self) -> str:
        return posixpath.join(self.root, "bin", "uv")

    @property
    def scripts(self) -> str:
        # helper scripts heavylift runs on the host (download, verify, readiness)
        return posixpath.join(self.root, "lib")

    @property
    def uv_cache(self) -> str:
        return self.uv_cache_dir or posixpath.join(self.root, "cache", "uv")

    def venv(self, name: str) -> str:
        return posixpath.join(self.root, "venvs", name)

    @property
    def venvs_dir(self) -> str:
        return posixpath.join(self.root, "venvs")

    @property
    def deployments_dir(self) -> str:
        return posixpath.join(self.root, "deployments")

    @property
    def models_dir(self) -> str:
        return posixpath.join(self.root, "models")

    def content(self, repo: str, commit: str) -> str:
        # pristine download: written by huggingface_hub only, never edited by heavylift
        return posixpath.join(self.models_dir, repo.replace("/", "--"), commit)

    def manifest(self, repo: str, commit: str) -> str:
        return self.content(repo, commit) + ".manifest.json"

    @property
    def deployment_dir(self) -> str:
        return posixpath.join(self.deployments_dir, self.deployment)

    @property
    def resolution_file(self) -> str:
        # the rules that fired on the last run, and the host's GPUs (JSON)
        return posixpath.join(self.deployment_dir, "resolution.json")

    def overlay_file(self, name: str) -> str:
        return posixpath.join(self.overlay, name)

    def script(self, name: str) -> str:
        return posixpath.join(self.scripts, name)

    @property
    def overlay(self) -> str:
        return posixpath.join(self.deployment_dir, "overlay")

    @property
    def active_venv(self) -> str:
        # symlink to the venv this deployment serves from
        return posixpath.join(self.deployment_dir, "venv")

    @property
    def launcher(self) -> str:
        return posixpath.join(self.deployment_dir, "serve")

    @property
    def private_dir(self) -> str:
        # mode 0700: a file written here is never readable by others, even in the moment
        # between its upload and its chmod
        return posixpath.join(self.deployment_dir, "private")

    @property
    def env_file(self) -> str:
        return posixpath.join(self.private_dir, "serve.env")

    @property
    def hub_token_file(self) -> str:
        # the HF token for the host's downloads (fetch_weights.py reads it; never in argv)
        return posixpath.join(self.private_dir, "hub.token")

    @property
    def pidfile(self) -> str:
        return posixpath.join(self.deployment_dir, "run", "serve.pid")

    @property
    def logfile(self) -> str:
        return posixpath.join(self.deployment_dir, "run", "serve.log")

    @property
    def unit_name(self) -> str:
        return f"heavylift-{self.deployment}.service"

    @property
    def unit_path(self) -> str:
        return posixpath.join(SYSTEMD_UNITS, self.unit_name)

    # --- releases, status, lock (operations/release.py, readiness.py, hostlock.py)

    @property
    def releases(self) -> str:
        return posixpath.join(self.deployment_dir, "releases")

    def release(self, release_id: str) -> str:
        # a release: its own launcher, a link to its venv and a copy of its overlay
        return posixpath.join(self.releases, release_id)

    def release_launcher(self, release_id: str) -> str:
        return posixpath.join(self.release(release_id), "serve")

    def release_venv(self, release_id: str) -> str:
        return posixpath.join(self.release(release_id), "venv")

    @property
    def current(self) -> str:
        # symlink to the release the service runs; the service starts current/serve
        return posixpath.join(self.deployment_dir, "current")

    @property
    def previous(self) -> str:
        # symlink to the release before current: where a failed readiness gate goes back to
        return posixpath.join(self.deployment_dir, "previous")

    @property
    def service_launcher(self) -> str:
        return posixpath.join(self.current, "serve")

    @property
    def status_file(self) -> str:
        # the last readiness gate's figures, JSON, world-readable (no secrets)
        return posixpath.join(self.deployment_dir, "status.json")

    @property
    def service_home(self) -> str:
        # HOME of the service user: vLLM's and torch's caches; the only place it may write
        return posixpath.join(self.root, "home")

    @property
    def lock(self) -> str:
        # one run at a time per host and root (operations/hostlock.py)
        return posixpath.join(self.root, "deploy.lock")

    @property
    def probe_script(self) -> str:
        return self.script("readiness_probe.py")

    # --- the site source (operations/sitesource.py): its server's files on the source host, its token on the others

    @property
    def site_source(self) -> SiteSourceLayout:
        return SiteSourceLayout(self.root)

    @property
    def site_source_headers(self) -> str:
        # the curl header file a copying host sends the site's token with (``-H @file``): 0600 in private/
        return posixpath.join(self.private_dir, "site-source.headers")

    # --- scripts/host_state.py reads every deployment of the host: their paths, NAME standing for each one's name

    def host_state_paths(self) -> dict:
        each = self.of(NAME)
        return {
            "root": self.root, "deployments": self.deployments_dir, "models": self.models_dir, "venvs": self.venvs_dir,
            # REPO is the repository's folder name: its "/" made "--" (``content``)
            "content": self.content(REPO, COMMIT), "deployment": each.deployment_dir, "releases": each.releases,
            "release_launcher": each.release_launcher(RELEASE), "release_venv": each.release_venv(RELEASE),
            "current": each.current,
            "previous": each.previous, "launcher": each.launcher, "active_venv": each.active_venv,
            "status": each.status_file, "pidfile": each.pidfile, "logfile": each.logfile, "unit": each.unit_path,
            "unit_name": each.unit_name,
            "site_source_launcher": self.site_source.launcher, "site_source_unit": self.site_source.unit_path,
            "site_source_unit_name": self.site_source.unit_name, "site_source_pidfile": self.site_source.pidfile,
            "site_source_logfile": self.site_source.logfile,
        }


@dataclass(frozen=True)
class SiteSourceLayout:
    """Where the site source's server keeps its files on the source host (the snapshots are the host's own)."""

    root: str
    unit_name: str = "heavylift-site-source.service"

    @property
    def folder(self) -> str:
        return posixpath.join(self.root, "site-source")

    @property
    def models(self) -> str:
        return Layout(self.root).models_dir

    @property
    def launcher(self) -> str:
        return posixpath.join(self.folder, "serve")

    @property
    def run_dir(self) -> str:
        return posixpath.join(self.folder, "run")

    @property
    def private_dir(self) -> str:
        return posixpath.join(self.folder, "private")

    @property
    def env_file(self) -> str:
        return posixpath.join(self.private_dir, "source.env")

    @property
    def pidfile(self) -> str:
        return posixpath.join(self.run_dir, "serve.pid")

    @property
    def logfile(self) -> str:
        return posixpath.join(self.run_dir, "serve.log")

    @property
    def unit_path(self) -> str:
        return posixpath.join(SYSTEMD_UNITS, self.unit_name)
