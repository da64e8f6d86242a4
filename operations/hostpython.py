"""The interpreter heavylift's own host scripts and facts run with (standard library only).

The system's ``/usr/bin/python3`` where the host has one, else ``python3`` from PATH. A ``python3``
on PATH may be a pyenv shim: a bash script that, on the test hosts and the demo machine, costs
0.3 s of CPU a start against 0.03 s for the interpreter itself (a no-op run starts about ten), and
answers "pyenv: python3: command not found" where no version is selected. The venvs' interpreter
is a setting of its own (``vllm.python``), unchanged by this.
"""

from pathlib import Path

from pyinfra.api import StringCommand

# heavylift's host scripts: real files, run with this interpreter
SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"

# shell words, no user value inside: both candidates are fixed names without spaces
PYTHON = StringCommand("$([ -x /usr/bin/python3 ] && echo /usr/bin/python3 || echo python3)")


def script(name: str) -> str:
    """A host script's text, from operations/scripts/ (run as ``python3 -c``: nothing uploaded)."""
    return (SCRIPTS_DIR / name).read_text()
