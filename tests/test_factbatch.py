"""operations/factbatch.py: facts read together answer what each read alone answers, and no answer
outlives a change. Through pyinfra's real fact path on its @local connector (files on this machine)."""

import subprocess

import pytest
from pyinfra.api import Config, Inventory, State, StringCommand
from pyinfra.api.connect import connect_all
from pyinfra.api.state import StateStage
from pyinfra.facts.files import Directory, File, Sha1File

from operations import factbatch


@pytest.fixture(autouse=True)
def record_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HEAVYLIFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HEAVYLIFT_FACT_BATCH", raising=False)
    yield
    factbatch._batches.clear()


def new_run(yes=False):
    """A fresh pyinfra state with @local connected, as one `pyinfra` process would have it (``yes``: `-y`, no prompt)."""
    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config(), check_for_changes=not yes)
    connect_all(state)
    state.current_stage = StateStage.Prepare
    host = inventory.get_host("@local")
    return state, host, factbatch.activate(host)


def end_run(batch):
    batch.save()
    factbatch._batches.clear()


def alone(command: str) -> tuple[int, list[str]]:
    """Exit status and stdout lines as pyinfra reads a command's output (connectors/util.py read_buffer)."""
    done = subprocess.run(["sh", "-c", command], capture_output=True)
    return done.returncode, [line.rstrip(b"\n").decode() for line in done.stdout.splitlines(keepends=True)]


@pytest.mark.parametrize("command", [
    "printf a", "printf 'a\\n'", "true", "printf '\\n'", "printf 'a\\n\\nb\\n\\n'", "echo out; echo err >&2",
    "exit 3", "printf 'x\\r\\n'", "echo '@@heavylift-fact 0 0'",
])
def test_a_batch_reads_what_each_command_alone_reads(command):
    commands = ["echo first", command, "printf 'last'"]
    done = subprocess.run(["sh", "-c", factbatch.batch_script(commands, "n0nce")], capture_output=True, check=True)
    lines = [line.rstrip(b"\n").decode() for line in done.stdout.splitlines(keepends=True)]
    parts = factbatch.split_output(lines, "n0nce")
    assert parts == {index: alone(c) for index, c in enumerate(commands)}


def test_the_next_run_reads_last_runs_facts_in_one_round_trip(tmp_path):
    (tmp_path / "a.txt").write_text("one\n")
    (tmp_path / "sub").mkdir()
    wanted = [(Sha1File, {"path": str(tmp_path / "a.txt")}), (File, {"path": str(tmp_path / "a.txt")}),
              (Directory, {"path": str(tmp_path / "sub")})]

    state, host, batch = new_run()
    first = [host.get_fact(cls, **kwargs) for cls, kwargs in wanted]
    assert batch.round_trips == 0 and batch.served == 0
    end_run(batch)

    state, host, batch = new_run()
    second = [host.get_fact(cls, **kwargs) for cls, kwargs in wanted]
    assert batch.round_trips == 1 and batch.served == 3
    assert second == first and first[0] and first[1]["size"] == 4

    # and the same answers as pyinfra's own reads, the batch off
    end_run(batch)
    inventory = Inventory((["@local"], {}))
    connect_all(State(inventory, Config()))
    assert [inventory.get_host("@local").get_fact(cls, **kwargs) for cls, kwargs in wanted] == first


def test_a_host_that_drifted_between_runs_answers_its_new_state(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("one\n")
    state, host, batch = new_run()
    before = host.get_fact(Sha1File, path=str(target))
    end_run(batch)

    target.write_text("changed by hand\n")
    state, host, batch = new_run()
    after = host.get_fact(Sha1File, path=str(target))
    assert batch.served == 1 and after != before and after is not None


def test_no_answer_outlives_a_change_the_run_makes(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("one\n")
    state, host, batch = new_run()
    host.get_fact(Sha1File, path=str(target))
    host.run_shell_command(f"echo two > {target}")  # an operation's command
    host.get_fact(Sha1File, path=str(target))
    end_run(batch)

    state, host, batch = new_run()
    before = host.get_fact(Sha1File, path=str(target))
    assert batch.served == 1
    host.run_shell_command(f"echo three > {target}")
    after = host.get_fact(Sha1File, path=str(target))
    assert after != before
    assert after == subprocess.run(["sha1sum", str(target)], capture_output=True, text=True).stdout.split()[0]


def test_the_execute_stage_reads_again(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("one\n")
    state, host, batch = new_run()
    host.get_fact(Sha1File, path=str(target))
    state.current_stage = StateStage.Execute
    host.get_fact(Sha1File, path=str(target))
    end_run(batch)

    state, host, batch = new_run()
    host.get_fact(Sha1File, path=str(target))
    target.write_text("between prepare and execute (a prompt)\n")
    state.current_stage = StateStage.Execute
    after = host.get_fact(Sha1File, path=str(target))
    assert batch.round_trips == 2
    assert after == subprocess.run(["sha1sum", str(target)], capture_output=True, text=True).stdout.split()[0]


def test_a_run_that_does_not_ask_reads_both_stages_in_one_round_trip(tmp_path):
    """With -y nothing runs on the host between the stages: the execute stage's first reads come with the
    prepare stage's last ones, and a change made after them is still seen."""
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("one\n")
    second.write_text("two\n")

    def run():
        state, host, batch = new_run(yes=True)
        host.get_fact(Sha1File, path=str(first))
        state.current_stage = StateStage.Execute
        answer = host.get_fact(Sha1File, path=str(second))
        return state, host, batch, answer

    *_, batch, _ = run()
    end_run(batch)
    state, host, batch, before = run()
    assert batch.round_trips == 1 and batch.served == 2
    host.run_shell_command(f"echo changed > {second}")  # an operation's command: the answer goes
    after = host.get_fact(Sha1File, path=str(second))
    assert after != before
    assert after == subprocess.run(["sha1sum", str(second)], capture_output=True, text=True).stdout.split()[0]


def test_a_command_carries_the_next_reads_run_after_it(tmp_path):
    """``command_then_facts`` (the deploy lock): the command's own output and status, and the facts the last run
    read next, in one round trip, read after the command ran."""
    target = tmp_path / "a.txt"
    target.write_text("before\n")
    command = StringCommand("echo", "taken", ";", "echo", "after", ">", str(target))

    def run():
        state, host, batch = new_run(yes=True)
        status, lines, _ = factbatch.command_then_facts(state, host, command)
        return state, host, batch, status, lines, host.get_fact(Sha1File, path=str(target))

    *_, batch, _, _, _ = run()
    assert batch.round_trips == 1 and batch.served == 0  # nothing recorded yet: the command alone
    end_run(batch)
    target.write_text("before\n")
    state, host, batch, status, lines, answer = run()
    assert status and lines == ["taken"]
    assert batch.round_trips == 1 and batch.served == 1
    assert answer == subprocess.run(["sha1sum", str(target)], capture_output=True, text=True).stdout.split()[0]
    assert target.read_text() == "after\n"
    # a command that fails reads nothing after it
    end_run(batch)
    state, host, batch = new_run(yes=True)
    status, lines, _ = factbatch.command_then_facts(state, host, StringCommand("echo", "locked", ";", "exit", "75"))
    assert not status and lines == ["locked"] and batch.answers == {}


def test_other_connector_arguments_are_another_read(tmp_path):
    state, host, _ = new_run()
    plain = factbatch.fact_command(state, host, File, None, {"path": "/tmp"})
    as_other = factbatch.fact_command(state, host, File, None, {"path": "/tmp", "_sudo": True})
    assert plain[0] == as_other[0] and plain[1] != as_other[1]


def test_a_record_names_facts_only_from_known_modules(tmp_path):
    state, host, batch = new_run()
    batch.previous = {batch.segment if batch.stage else "3.0": [["os", "system", {"command": "touch /tmp/never"}],
                                                                  ["pyinfra.facts.files", "File", {"path": "/tmp"}]]}
    host.get_fact(File, path="/tmp")
    assert batch.round_trips == 1 and batch.served == 1
    assert not __import__("os").path.exists("/tmp/never")


def test_off_switch(monkeypatch):
    monkeypatch.setenv("HEAVYLIFT_FACT_BATCH", "0")
    inventory = Inventory((["@local"], {}))
    State(inventory, Config())
    assert factbatch.activate(inventory.get_host("@local")) is None
