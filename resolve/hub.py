"""The control machine's Hub calls at plan time, behind one small interface that carries the site's token.

Planning asks the Hub four things: the commit a revision stands for (lock resolution), the files of a
commit (sizes and LFS hashes), a small config file of a commit (the pristine configs), and whether a
repository exists at all (to tell a missing revision from a missing repository on a mirror). The real
client (``HubClient``) sends the site's ``hf_token`` with each, whatever its source (``env:NAME`` or
``file:PATH``): huggingface_hub 2.4.0 only falls back to the ``HF_TOKEN`` environment variable or its
token file when ``token`` is None (huggingface_hub/utils/_auth.py ``get_token``), so a site whose token
lives elsewhere would otherwise plan a gated repository without it. Tests plan against stand-ins.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from pydantic import SecretStr

from . import plancache


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    sha256: str | None  # the Hub's LFS sha256 where it gives one


@dataclass(frozen=True)
class Snapshot:
    repo: str
    commit: str
    files: tuple[HubFile, ...]


def matches(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, pattern) for pattern in patterns)


class Hub(Protocol):
    """What planning needs from a Hub (or a mirror); errors are huggingface_hub's own."""

    endpoint: str | None

    def commit(self, repo: str, revision: str) -> str: ...

    def _who(self) -> str | None:
        """Whose answer is kept: a gated repository answers one token and refuses another (or none). A digest,
        never the token itself."""
        import hashlib

        token = self._token()
        return hashlib.sha256(token.encode()).hexdigest()[:16] if token else None

    def files(self, repo: str, commit: str) -> list[HubFile]: ...

    def json_file(self, repo: str, commit: str, filename: str) -> dict | None: ...

    def exists(self, repo: str) -> bool: ...


def snapshot(hub: Hub, repo: str, commit: str, patterns: tuple[str, ...]) -> Snapshot:
    """The files of a pinned commit that the deployment needs."""
    found = [f for f in hub.files(repo, commit) if matches(f.path, list(patterns))]
    if not found:
        raise ValueError(f"{repo}@{commit} has no files matching {list(patterns)}")
    return Snapshot(repo, commit, tuple(sorted(found, key=lambda f: f.path)))


@dataclass(frozen=True)
class HubClient:
    """The real Hub through huggingface_hub, with the site's endpoint and token."""

    endpoint: str | None = None
    token: SecretStr | None = None
    refresh: bool = False  # refresh_lock: ask again what plancache keeps

    def _token(self) -> str | None:
        return self.token.get_secret_value() if self.token is not None else None

    def commit(self, repo: str, revision: str) -> str:
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.endpoint, token=self._token()).model_info(repo, revision=revision).sha

    def _who(self) -> str | None:
        """Whose answer is kept: a gated repository answers one token and refuses another (or none). A digest,
        never the token itself."""
        import hashlib

        token = self._token()
        return hashlib.sha256(token.encode()).hexdigest()[:16] if token else None

    def files(self, repo: str, commit: str) -> list[HubFile]:
        if not plancache.FULL_COMMIT.match(commit):
            return list(_listed(repo, commit, self.endpoint, self._token()))
        # a commit is the hash of its content: its listing is kept on the control machine (resolve/plancache.py)
        kept = plancache.kept(
            "hub-tree", {"endpoint": plancache.hub_endpoint(self.endpoint), "repo": repo, "commit": commit, "token": self._who()},
            lambda: [[f.path, f.size, f.sha256] for f in _listed(repo, commit, self.endpoint, self._token())],
            self.refresh,
        )
        return [HubFile(path, size, sha) for path, size, sha in kept]

    def json_file(self, repo: str, commit: str, filename: str) -> dict | None:
        if not plancache.FULL_COMMIT.match(commit):
            return _json_file(repo, commit, filename, self.endpoint, self._token())
        key = {"endpoint": plancache.hub_endpoint(self.endpoint), "repo": repo, "commit": commit, "file": filename,
               "token": self._who()}
        return plancache.kept("hub-file", key, lambda: _json_file(repo, commit, filename, self.endpoint, self._token()),
                              self.refresh)

    def exists(self, repo: str) -> bool:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=self.endpoint, token=self._token())
        for revision in (None, "main"):
            try:
                api.model_info(repo, revision=revision)
                return True
            except Exception:  # noqa: BLE001 (any answer but a good one: not known)
                continue
        return False


# a pinned commit never changes: every host of a run (pyinfra runs deploy.py once per host) shares the answers
@lru_cache(maxsize=None)
def _listed(repo: str, commit: str, endpoint: str | None, token: str | None) -> tuple[HubFile, ...]:
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint, token=token)
    return tuple(
        HubFile(item.path, item.size, item.lfs.sha256 if item.lfs else None)
        for item in api.list_repo_tree(repo, revision=commit, recursive=True)
        if isinstance(item, RepoFile)
    )


@lru_cache(maxsize=None)
def _json_file(repo: str, commit: str, filename: str, endpoint: str | None, token: str | None) -> dict | None:
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(repo, filename, revision=commit, endpoint=endpoint, token=token)
    with open(path) as handle:
        return json.load(handle)
