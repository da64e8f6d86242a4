"""operations/hostpython.py: the interpreter heavylift's host scripts run with, picked by the host's shell."""

import subprocess

from operations import hostpython


def picked(path_dirs: str, usr_bin_python3: bool = True) -> str:
    """What the host's shell makes of ``hostpython.PYTHON`` with ``PATH`` set to ``path_dirs``."""
    command = str(hostpython.PYTHON)
    if not usr_bin_python3:  # a host without /usr/bin/python3: the same words with a path that is not there
        command = command.replace("/usr/bin/python3", "/nonexistent/python3")
    return subprocess.run(["sh", "-c", f"echo {command}"], capture_output=True, text=True,
                          env={"PATH": path_dirs}).stdout.strip()


def test_the_system_python3_wins_over_a_shim_first_on_path(tmp_path):
    assert (hostpython.Path("/usr/bin/python3")).exists(), "this machine has no /usr/bin/python3 to pick"
    (tmp_path / "python3").write_text("#!/bin/sh\necho pyenv: python3: command not found >&2; exit 127\n")
    (tmp_path / "python3").chmod(0o755)
    assert picked(f"{tmp_path}:/usr/bin:/bin") == "/usr/bin/python3"


def test_without_a_system_python3_the_one_on_path_is_used(tmp_path):
    assert picked(f"{tmp_path}:/usr/bin:/bin", usr_bin_python3=False) == "python3"


def test_a_script_is_the_file_of_operations_scripts():
    text = hostpython.script("service_procs.py")
    assert text == (hostpython.SCRIPTS_DIR / "service_procs.py").read_text() and "Standard library only" in text
