"""resolve/context.py: the run's context read from pyinfra's own command line (inventory, --dry, --data, the lock file)."""

import subprocess
import sys

from resolve.context import VALUE_OPTIONS, CommandLine, RunContext


def test_run_context_reads_pyinfras_command_line(tmp_path):
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "site.py").write_text("hosts = []\n")
    line = CommandLine.parse(["-y", "--limit", "gpu1", "--data", "until=prepare", "inventory/site.py", "deploy.py", "--dry",
                              "--group-data=extra", "--diff"])
    assert (line.inventory, line.dry, line.group_data) == ("inventory/site.py", True, ("extra",))
    # a flag's value that looks like a file is no inventory
    assert CommandLine.parse(["--config", "x.py", "inventory/site.py", "deploy.py"]).inventory == "inventory/site.py"
    run = RunContext.build(tmp_path, ["inventory/site.py", "deploy.py"], environ={})
    assert (run.inventory, run.dry, run.until) == ((tmp_path / "inventory" / "site.py").resolve(), False, "serve")
    assert run.lock_file == (tmp_path / "inventory" / "site.lock.json").resolve()


def test_value_options_are_pyinfras():
    """The parser's table against pyinfra's own click command, in a subprocess: importing pyinfra_cli
    gevent-patches the process that imports it."""
    listed = subprocess.run(
        [sys.executable, "-c", "from pyinfra_cli.cli import cli; print('\\n'.join(sorted(o for p in cli.params "
         "if p.param_type_name == 'option' and not (p.is_flag or p.count) for o in p.opts if o.startswith('--'))))"],
        capture_output=True, text=True, check=True,
    )
    assert set(listed.stdout.split()) == VALUE_OPTIONS
