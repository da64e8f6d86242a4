"""Every heavylift fact against fixtures: arguments -> exact command; host output -> fact value.

Cases: tests/facts/<module>.<Fact>/<case>.json (format: tests/pyinfra_fixtures.py).
Each fact's command run on this machine (pyinfra's @local connector) is tested in its module's own
file, tests/test_operations_<module>.py.
"""

import sys

import pytest

if "pyinfra_fixtures" not in sys.modules:  # its asserts explain themselves
    pytest.register_assert_rewrite("pyinfra_fixtures")

from pyinfra_fixtures import case_params, run_fact_case  # noqa: E402


@pytest.mark.parametrize(("target", "case", "data"), case_params("facts"))
def test_fact(target, case, data):
    run_fact_case(target, data)


def test_every_fact_has_cases():
    from importlib import import_module
    from pathlib import Path

    from pyinfra.api import FactBase

    folders = {p.name for p in (Path(__file__).parent / "facts").iterdir() if p.is_dir()}
    for module_name in ("runtime", "weights", "checkpoint", "service", "readiness", "release", "secrets"):
        module = import_module(f"operations.{module_name}")
        for name, value in vars(module).items():
            if isinstance(value, type) and issubclass(value, FactBase) and value.__module__ == module.__name__:
                assert f"{module_name}.{name}" in folders, f"no cases for fact {module_name}.{name}"
