"""pyinfra's configuration file for heavylift's commands (deploy.py, rollback.py, retire.py, status.py).

pyinfra 3.10 executes ``config.py`` from the folder it runs in, before it reads the inventory or
connects to any host (pyinfra_cli/cli.py ``_set_config``; ``--config`` names another file). Run
pyinfra from the repository root, as every command in the README does.
"""

from pyinfra.context import ctx_state

from operations.reach import report_unreachable

# a host that cannot be reached is named, with why, as the run's last words (operations/reach.py)
report_unreachable(ctx_state.get())
