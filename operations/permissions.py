"""Permissions: what the service user reads is readable by it, whatever root's umask is.

heavylift creates its files as root and vLLM runs as an unprivileged user. On a hardened host
(umask 027 or 077 from login.defs or pam_umask, as CIS benchmarks ask) every folder root makes
is born 0700 and every file 0600, and the unit fails at once ("Failed to execute .../serve:
Permission denied", status 203/EXEC). Copies keep the modes they were made with: uv copies from
its cache (UV_LINK_MODE=copy), ``cp -a`` a release's overlay. So the trees the service reads (the
weights, the release, the host scripts) and every folder above them are checked on each run and
given ``go+rX`` where they lack it: nothing else changes mode, and the secrets
(``<deployment>/private``, 0700) are in none of them. A venv is opened once, by the operation that
builds it (runtime.venv), since it never changes after; here only the folders on the way to it and
the venv's own folder are checked.
"""

from __future__ import annotations

import posixpath

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, operation


class NotReadableByOthers(FactBase):
    """Paths other users cannot read: in ``trees`` (recursively; links not followed) the first
    entry found in each, and each of ``folders`` (the folder itself) that others cannot enter."""

    def command(self, trees, folders):
        # -perm -005: r and x for others on folders; -perm -004: r on files; missing paths are skipped
        checks = [
            StringCommand(
                "[", "!", "-e", QuoteString(tree), "]", "||", "find", QuoteString(tree),
                "\\(", "-type", "d", "!", "-perm", "-005", "-o", "-type", "f", "!", "-perm", "-004", "\\)",
                "-printf", QuoteString("tree %H\\n"), "-quit", ";",
            )
            for tree in trees
        ]
        checks += [
            StringCommand(
                "[", "!", "-d", QuoteString(folder), "]", "||",
                "find", QuoteString(folder), "-maxdepth", "0", "!", "-perm", "-005", "-printf", QuoteString("folder %p\\n"), ";",
            )
            for folder in folders
        ]
        return StringCommand(*checks, "true")

    def process(self, output):
        found = {"trees": [], "folders": []}
        for line in output:
            kind, _, path = line.strip().partition(" ")
            if kind in ("tree", "folder") and path:
                found[kind + "s"].append(path)
        return found

    def default(self):
        return {"trees": [], "folders": []}


def folders_above(path: str, stop: str = "/") -> list[str]:
    """Every folder from ``stop`` (excluded) down to the one holding ``path``, outermost first."""
    folders = []
    parent = path.rstrip("/").rsplit("/", 1)[0]
    while parent and parent != stop.rstrip("/") and parent.startswith(stop.rstrip("/") + "/"):
        folders.append(parent)
        parent = parent.rsplit("/", 1)[0]
    return folders[::-1]


@operation()
def readable_by_service(trees: list[str], root: str, opened_when_built: list[str] = ()):
    """
    The service user can read these trees and enter every folder from ``root`` down to them
    (``chmod go+rX``, only where needed).

    + trees: folders whose whole content the service reads (weights, release, host scripts)
    + root: heavylift's root: it and the folders below it on the way to the trees are opened; none above it
    + opened_when_built: trees opened once when they were built and never changed after (a venv: 60 000
      files, 0.3 s to search on every run); only they and the folders on the way to them are checked here
    """
    stop = posixpath.dirname(root.rstrip("/"))
    folders = list(dict.fromkeys(
        [folder for tree in [*trees, *opened_when_built] for folder in folders_above(tree, stop=stop)]
        + list(opened_when_built)
    ))
    found = host.get_fact(NotReadableByOthers, trees=list(trees), folders=folders)
    if not found["trees"] and not found["folders"]:
        host.noop(f"{len(trees)} trees and {len(folders)} folders are readable by the service user")
        return
    for folder in found["folders"]:
        yield StringCommand("chmod", "go+rx", QuoteString(folder))
    for tree in found["trees"]:
        # chmod -R does not follow the links it meets (a release's venv and overlay links)
        yield StringCommand("chmod", "-R", "go+rX", QuoteString(tree))
