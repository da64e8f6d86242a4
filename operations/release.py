"""Releases: what one converged run serves, kept so that a rollback is a link switch and a restart.

A release is (venv, overlay, launcher: the vLLM arguments and environment), named by a hash
of them: ``<deployment>/releases/<id>/`` holds its own launcher, a link to its venv (venvs are
content-addressed and never changed) and a copy of its overlay (links to the pristine
download plus the rendered configs: kilobytes). ``current`` links to the release the service
runs, ``previous`` to the one before it. Older releases are removed, the last KEEP kept.
"""

from __future__ import annotations

import posixpath

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, operation

from resolve.launcher import HERE, KEEP, launcher_lines, release_id  # noqa: F401 (planned in resolve/)


def link_switch(link: str, target: str) -> list[StringCommand]:
    """``link`` -> ``target`` by ln + rename: the link is never missing, even for a moment. The one switch
    of a release going live (``current``), of ``previous``, and of a failed gate's rollback (readiness.py)."""
    return [
        StringCommand("ln", "-sfn", QuoteString(target), QuoteString(link + ".new")),
        StringCommand("mv", "-T", QuoteString(link + ".new"), QuoteString(link)),
    ]


class ReleaseLinks(FactBase):
    """The release ids ``current`` and ``previous`` point at, and every release folder present."""

    def command(self, deployment_dir):
        folder = QuoteString(deployment_dir)
        return StringCommand(
            "cd", folder, "2>/dev/null", "&&", "echo", "current=$(readlink current)", "&&",
            "echo", "previous=$(readlink previous)", "&&", "ls", "-1t", "releases", "2>/dev/null", "|",
            "sed", "s/^/release=/", "||", "true",
        )

    def process(self, output):
        links = {"current": None, "previous": None, "releases": []}
        for line in output:
            key, _, value = line.strip().partition("=")
            if key in ("current", "previous"):
                links[key] = value.rsplit("/", 1)[-1] or None
            elif key == "release" and value and not value.endswith(".tmp"):
                links["releases"].append(value)
        return links

    def default(self):
        return {"current": None, "previous": None, "releases": []}


@operation()
def staged(release_dir: str, launcher: str, overlay: str, venv: str, model_link: str | None = None):
    """
    A release folder, built once from the staging launcher and overlay, never changed after.

    + release_dir: <deployment>/releases/<id>
    + launcher: the rendered staging launcher (copied)
    + overlay: the staging overlay folder (copied, links kept as links)
    + venv: the venv the release runs (linked)
    + model_link: a link to the release's overlay, the name vLLM is started with (resolve/launcher.py
      model_key: named by what shapes vLLM's compiled graph, so its compile cache serves the next release)
    """
    releases = posixpath.dirname(release_dir)
    links = host.get_fact(ReleaseLinks, deployment_dir=posixpath.dirname(releases))
    if posixpath.basename(release_dir) in links["releases"]:
        host.noop(f"release {posixpath.basename(release_dir)} exists")
        return
    building = release_dir + ".tmp"
    # built beside, then renamed: a release folder is complete or absent
    yield StringCommand("rm", "-rf", QuoteString(building))
    yield StringCommand("mkdir", "-p", QuoteString(building))
    yield StringCommand("cp", "-a", QuoteString(overlay), QuoteString(building + "/overlay"))
    yield StringCommand("cp", "-p", QuoteString(launcher), QuoteString(building + "/serve"))
    yield StringCommand("ln", "-s", QuoteString(venv), QuoteString(building + "/venv"))
    if model_link and model_link != "overlay":
        yield StringCommand("ln", "-s", "overlay", QuoteString(f"{building}/{model_link}"))
    yield StringCommand("mv", "-T", QuoteString(building), QuoteString(release_dir))


@operation()
def current(deployment_dir: str, release: str, keep: int = KEEP):
    """
    ``current`` pointing at this release, ``previous`` at the one it replaces; old ones pruned.

    + deployment_dir: the deployment's folder (holds releases/, current, previous)
    + release: the release id to serve
    + keep: how many releases to keep (current and previous always are)
    """
    links = host.get_fact(ReleaseLinks, deployment_dir=deployment_dir)
    if links["current"] == release:
        host.noop(f"release {release} is current")
        return
    cur, prev = posixpath.join(deployment_dir, "current"), posixpath.join(deployment_dir, "previous")
    if links["current"]:
        yield from link_switch(prev, f"releases/{links['current']}")
    yield from link_switch(cur, f"releases/{release}")
    protected = {release, links["current"]}
    kept = [r for r in links["releases"] if r not in protected][: max(0, keep - len([p for p in protected if p]))]
    for old in links["releases"]:
        if old not in protected and old not in kept:
            yield StringCommand("rm", "-rf", QuoteString(posixpath.join(deployment_dir, "releases", old)))
