"""A real Hugging Face Hub-compatible server on 127.0.0.1 (olah, offline) serving local git repos."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

# fixed identity and dates: publishing the same files always yields the same commit sha
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "heavylift testbed",
    "GIT_AUTHOR_EMAIL": "testbed@heavylift.invalid",
    "GIT_COMMITTER_NAME": "heavylift testbed",
    "GIT_COMMITTER_EMAIL": "testbed@heavylift.invalid",
}
# epoch of the first commit; each later commit is one minute newer so "newest" is never a tie
FIRST_COMMIT_EPOCH = 1767225600  # 2026-01-01T00:00:00Z
LOOPBACK = "127.0.0.1"
CONFIG_NAME = "olah.toml"
LOG_NAME = "olah.log"
# a cheap API route: olah answers 401 "Repository not found" once it serves (its "/" page answers 500 offline)
READINESS_PATH = "/api/models/heavylift-testbed/readiness-probe/revision/main"


# ---------------------------------------------------------------- publishing


def repo_dir(mirror_dir: str | Path, repo_id: str) -> Path:
    """Where olah looks for a model repo: <mirrors-path>/models/<org>/<name>."""
    org, name = repo_id.split("/")
    return Path(mirror_dir) / "models" / org / name


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        # neutralise user/global settings that would change the bytes or the sha of a commit
        ["git", "-C", str(repo), "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false",
         "-c", "core.hooksPath=/dev/null", *args],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    return result.stdout.strip()


def ensure_git_repo(repo: Path) -> None:
    if (repo / ".git").is_dir():
        return
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "--quiet", "--initial-branch=main")


def replace_work_tree(repo: Path, src: Path) -> None:
    """Make the work tree an exact copy of src, so files deleted in src disappear from the next commit."""
    for entry in repo.iterdir():
        if entry.name == ".git":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    shutil.copytree(src, repo, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git"))


def commit_count(repo: Path) -> int:
    try:
        return int(git(repo, "rev-list", "--count", "HEAD"))
    except subprocess.CalledProcessError:  # no commit yet
        return 0


def has_staged_changes(repo: Path) -> bool:
    if commit_count(repo) == 0:
        return True
    return subprocess.run(["git", "-C", str(repo), "diff", "--cached", "--quiet"]).returncode != 0


def commit_all(repo: Path, message: str) -> None:
    date = f"@{FIRST_COMMIT_EPOCH + 60 * commit_count(repo)} +0000"
    git(repo, "commit", "--quiet", "--allow-empty", "-m", message,
        env={**GIT_IDENTITY, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})


def publish_repo(mirror_dir: str | Path, repo_id: str, src_folder: str | Path, message: str | None = None) -> str:
    """Commit src_folder's files as the new head of branch main of repo_id; return the commit sha.

    Identical content keeps the current sha (no new commit); changed content adds one commit.
    """
    src = Path(src_folder)
    if not src.is_dir():
        raise FileNotFoundError(f"not a folder: {src}")
    repo = repo_dir(mirror_dir, repo_id)
    ensure_git_repo(repo)
    replace_work_tree(repo, src)
    git(repo, "add", "--all", "--force")  # --force: a .gitignore (or a global excludes file) must not drop files
    if has_staged_changes(repo):
        commit_all(repo, message or f"Publish {repo_id}")
    return git(repo, "rev-parse", "HEAD")


# ---------------------------------------------------------------- serving


def free_port(host: str = LOOPBACK) -> int:
    # olah must know its own port up front (mirror-netloc), so port 0 can't be left to the server
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def olah_config(mirror_dir: Path, host: str, port: int) -> str:
    """olah 0.5.4 keys (olah/configs.py): offline, serve only mirrors-path, keep its cache inside mirror_dir."""
    netloc = f"{host}:{port}"
    # JSON string literals are valid TOML basic strings, quoting included
    q = json.dumps
    return (
        "[basic]\n"
        f"host = {q(host)}\n"
        f"port = {port}\n"
        'mirror-scheme = "http"\n'
        f"mirror-netloc = {q(netloc)}\n"
        f"mirror-lfs-netloc = {q(netloc)}\n"
        f"repos-path = {q(str(mirror_dir / 'cache'))}\n"
        f"mirrors-path = [{q(str(mirror_dir))}]\n"
        "\n"
        "[accessibility]\n"
        "offline = true\n"
    )


def olah_command(config_path: Path, log_dir: Path) -> list[str]:
    # olah.server's own console-script entry (`olah-cli`), run by this interpreter so no PATH lookup is needed
    return [
        sys.executable, "-c", "from olah.server import cli; cli()",
        "--config", str(config_path), "--log-path", str(log_dir),
    ]


def write_config(mirror_dir: Path, host: str, port: int) -> Path:
    mirror_dir.mkdir(parents=True, exist_ok=True)
    config_path = mirror_dir / CONFIG_NAME
    config_path.write_text(olah_config(mirror_dir.resolve(), host, port))
    return config_path


def answers_http(url: str, timeout: float = 1.0) -> bool:
    """Any HTTP answer counts: olah serves repos straight from disk, so once it answers it is ready."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


class HubMirror:
    """olah as a subprocess on 127.0.0.1, serving every repo published under mirror_dir.

    with HubMirror(tmp_path / "hub") as hub:
        snapshot_download("org/name", revision=sha, endpoint=hub.url, local_dir=...)
    """

    def __init__(
        self,
        mirror_dir: str | Path,
        port: int = 0,
        host: str = LOOPBACK,
        startup_timeout: float = 60.0,
        netns_path: str | None = None,
    ):
        """netns_path: run olah in that network namespace (a bridge bed's switch, with `host` its
        bridge address and `port` given: a free port can't be looked up from outside it)."""
        self.mirror_dir = Path(mirror_dir).resolve()
        self.host = host
        self.netns_path = netns_path
        if netns_path and not port:
            raise ValueError("a mirror in another network namespace needs its port given")
        self.port = port or free_port(host)
        self.startup_timeout = startup_timeout
        self.log_path = self.mirror_dir / LOG_NAME
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> HubMirror:
        config_path = write_config(self.mirror_dir, self.host, self.port)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self._in_netns(olah_command(config_path, self.mirror_dir / "logs")),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.mirror_dir,
            )
        try:
            self.wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"olah exited with {self.process.returncode}; see {self.log_path}")
            if self._answers(self.url + READINESS_PATH):
                return
            time.sleep(0.1)
        raise TimeoutError(f"olah did not answer on {self.url} within {self.startup_timeout}s; see {self.log_path}")

    def _in_netns(self, argv: list[str]) -> list[str]:
        return ["nsenter", f"--net={self.netns_path}", "--", *argv] if self.netns_path else argv

    def _answers(self, url: str) -> bool:
        if not self.netns_path:
            return answers_http(url)
        probe = f"from testbed.hub_mirror import answers_http; raise SystemExit(0 if answers_http({url!r}) else 1)"
        done = subprocess.run(
            self._in_netns([sys.executable, "-c", probe]), cwd=Path(__file__).resolve().parent.parent,
            capture_output=True,
        )
        return done.returncode == 0

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> HubMirror:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


# ---------------------------------------------------------------- CLI


def serve_forever(mirror_dir: Path, host: str, port: int) -> None:
    """Replace this process with olah, so the caller's PID, signals and output are olah's own."""
    port = port or free_port(host)
    config_path = write_config(mirror_dir.resolve(), host, port)
    print(f"serving {mirror_dir} at http://{host}:{port}", flush=True)
    command = olah_command(config_path, mirror_dir.resolve() / "logs")
    os.execv(command[0], command)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A local Hugging Face Hub mirror (olah, offline) for tests and demos.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the mirror in the foreground")
    serve.add_argument("--dir", required=True, type=Path, help="mirror folder (repos under models/<org>/<name>)")
    serve.add_argument("--port", type=int, default=0, help="0 picks a free port")
    serve.add_argument("--host", default=LOOPBACK)
    publish = commands.add_parser("publish", help="commit a folder as the head of a repo's main branch")
    publish.add_argument("--dir", required=True, type=Path)
    publish.add_argument("--repo", required=True, help="org/name")
    publish.add_argument("--src", required=True, type=Path, help="folder whose files become the repo")
    publish.add_argument("--message", default=None)
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve_forever(args.dir, args.host, args.port)
    else:
        print(publish_repo(args.dir, args.repo, args.src, args.message))


if __name__ == "__main__":
    main()
