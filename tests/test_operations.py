"""Every heavylift operation against fixtures: arguments + host facts -> exact commands or noop.

Cases: tests/operations/<module>.<operation>/<case>.json (format: tests/pyinfra_fixtures.py).
A module's other unit tests are in its own file, tests/test_operations_<module>.py (the commands run
by a shell on this machine included).
"""

import sys

import pytest

if "pyinfra_fixtures" not in sys.modules:  # its asserts explain themselves
    pytest.register_assert_rewrite("pyinfra_fixtures")

from pyinfra_fixtures import case_params, run_operation_case  # noqa: E402


@pytest.mark.parametrize(("target", "case", "data"), case_params("operations"))
def test_operation(target, case, data, tmp_path, monkeypatch):
    run_operation_case(target, data, tmp_path, monkeypatch)


# --- every operation has cases ----------------------------------------------------------------

def test_every_operation_has_cases():
    import inspect
    from importlib import import_module
    from pathlib import Path

    folders = {p.name for p in (Path(__file__).parent / "operations").iterdir() if p.is_dir()}
    for module_name in ("runtime", "weights", "checkpoint", "service", "readiness", "release", "secrets"):
        module = import_module(f"operations.{module_name}")
        for name, value in vars(module).items():
            if callable(value) and hasattr(value, "_inner") and inspect.getmodule(value._inner) is module:
                assert f"{module_name}.{name}" in folders, f"no cases for operation {module_name}.{name}"
