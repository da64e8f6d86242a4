"""Waves (operations/waves.py): the order the real pyinfra 3.10 CLI runs the waves in, with a stand-in for the switch
and gate (testbed/waves_deploy.py): each wave's switch only after the wave before it passed, and the waves after a
failure held. The plan itself: tests/test_resolve_waves.py."""

import pytest

from conftest import run_pyinfra


# --- the real pyinfra CLI ---------------------------------------------------------------------------------
# Three hosts through pyinfra's @chroot connector into this machine's own / (``chroot / sh -c ...``):
# three names, three connections, the real CLI and its operation order, no test hosts to start. Each
# host writes only under its own folder in tmp_path.

NAMES = ("@chroot//", "@chroot//.", "@chroot///")


@pytest.fixture()
def bed(tmp_path):
    inventory = tmp_path / "site.py"
    folders = {name: tmp_path / f"host{i + 1}" for i, name in enumerate(NAMES)}
    hosts = [(name, {"waves_dir": str(folder), "root": str(tmp_path / "root")}) for name, folder in folders.items()]
    inventory.write_text(f"hosts = {hosts!r}\n")
    return folders, inventory


def switched_at(folder):
    found = folder / "switched"
    return [float(value) for value in found.read_text().split()] if found.exists() else []


@pytest.mark.e2e  # real pyinfra runs (3-5 s each): the full suite's
def test_each_wave_switches_after_the_wave_before_it_passed(bed):
    folders, inventory = bed
    run = run_pyinfra(inventory, "--data", "wave_size=1", deploy="testbed/waves_deploy.py")
    assert run.returncode == 0, run.output[-4000:]
    times = [switched_at(folders[name]) for name in NAMES]
    assert all(len(t) == 1 for t in times), times
    # each switch waits for the previous wave's 0.5 s switch and 0.5 s gate
    assert times[1][0] - times[0][0] >= 1.0 and times[2][0] - times[1][0] >= 1.0, times
    assert "--> Rolling out in 3 waves (stand-in: 1 at a time): 1: @chroot//; 2: @chroot//.; 3: @chroot///" in run.output
    assert "--> Rollout: all 3 waves rolled out" in run.output, run.output[-3000:]


@pytest.mark.e2e  # real pyinfra runs (3-5 s each): the full suite's
def test_a_wave_of_two_switches_together(bed):
    folders, inventory = bed
    run = run_pyinfra(inventory, "--data", "max_unavailable=2", deploy="testbed/waves_deploy.py")
    assert run.returncode == 0, run.output[-4000:]
    times = [switched_at(folders[name])[0] for name in NAMES]
    assert abs(times[1] - times[0]) < 0.5 and times[2] - times[1] >= 1.0, times


@pytest.mark.e2e  # real pyinfra runs (3-5 s each): the full suite's
def test_a_failed_wave_holds_the_waves_after_it(bed):
    folders, inventory = bed
    run = run_pyinfra(inventory, "--data", "wave_size=1", "--data", "waves_fail=@chroot//.", deploy="testbed/waves_deploy.py")
    assert run.returncode != 0, run.output[-4000:]
    assert len(switched_at(folders[NAMES[0]])) == 1 and len(switched_at(folders[NAMES[1]])) == 1
    assert switched_at(folders[NAMES[2]]) == []  # held: its switch never ran
    assert ("[@chroot///] held: the rollout stopped before wave 3 of 3 (@chroot///): @chroot//.: 'gate (stand-in)' "
            "failed; it keeps serving what it serves, untouched") in run.output, run.output[-4000:]
    assert "--> Rollout stopped in wave 2 of 3: @chroot//.: 'gate (stand-in)' failed; waves 3-3 were held" in run.output
    for line in ("wave 1: @chroot//: runs release nothing: rolled out",
                 "wave 2: @chroot//.: runs release nothing: failed ('gate (stand-in)' failed)",
                 "wave 3: @chroot///: runs release nothing: held, untouched"):
        assert line in run.output, run.output[-3000:]


@pytest.mark.e2e  # real pyinfra runs (3-5 s each): the full suite's
@pytest.mark.parametrize("refused", [0, 1], ids=["first-wave", "middle-wave"])
def test_a_host_refused_while_prepared_holds_no_wave_and_fails_the_run(bed, refused):
    """when_disk_too_small: proceed: the refused host gets nothing but its failure; every other wave goes."""
    folders, inventory = bed
    name = NAMES[refused]
    run = run_pyinfra(inventory, "--data", "wave_size=1", "--data", f"waves_refuse={name}", deploy="testbed/waves_deploy.py")
    assert run.returncode != 0, run.output[-4000:]  # the run names what it left out
    assert f"refused, left untouched: {name}: refused while prepared (stand-in)" in run.output, run.output[-4000:]
    assert switched_at(folders[name]) == [] and not folders[name].exists()  # not even the prepared folder
    others = [other for other in NAMES if other != name]
    assert all(len(switched_at(folders[other])) == 1 for other in others), run.output[-4000:]
    assert "held" not in run.output.split("--> Rolling out", 1)[-1].split("--> Rollout")[0], run.output[-4000:]
