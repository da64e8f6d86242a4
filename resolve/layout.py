"""Where heavylift keeps things on a host: one place that names every path."""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass


def spec_id(spec: dict) -> str:
    """A short content address for a spec: same spec, same folder; any change, a new one."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Layout:
    root: str
    deployment: str
    uv_cache_dir: str | None = None

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

    def content(self, repo: str, commit: str) -> str:
        # pristine download: written by huggingface_hub only, never edited by heavylift
        return posixpath.join(self.root, "models", repo.replace("/", "--"), commit)

    def manifest(self, repo: str, commit: str) -> str:
        return self.content(repo, commit) + ".manifest.json"

    @property
    def deployment_dir(self) -> str:
        return posixpath.join(self.root, "deployments", self.deployment)

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
        return posixpath.join("/etc/systemd/system", self.unit_name)

    # --- releases, status, lock (operations/release.py, readiness.py, hostlock.py)

    @property
    def releases(self) -> str:
        return posixpath.join(self.deployment_dir, "releases")

    def release(self, release_id: str) -> str:
        # a release: its own launcher, a link to its venv and a copy of its overlay
        return posixpath.join(self.releases, release_id)

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
        return posixpath.join(self.scripts, "readiness_probe.py")
