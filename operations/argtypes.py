"""pyinfra's global arguments and their types, worked out once per run instead of once per call.

pyinfra 3.10 builds the list of its global arguments (``_sudo``, ``_env``, ``_if``, ...) from the type
hints of ``AllArguments`` on every call of ``api/arguments.py`` ``all_global_arguments``:
``typing.get_type_hints`` evaluates every annotation again (about 0.3 ms). It is called for every
operation and, through ``api/facts.py`` ``_handle_fact_kwargs`` -> ``pop_global_arguments``, for every
fact read; a converged heavylift re-run reads 44 facts a host, and the fact batch
(operations/factbatch.py) builds each read's command twice (once to prefetch it, once when it is
asked), so this was about 55 ms of the control machine's CPU per host, measured with py-spy on
benchmarks/bench_fleet.py's 8-host bed (2026-12-06). A plain pyinfra run of one operation calls it
a handful of times.

The hints are those of a class that does not change while pyinfra runs, so ``cached_global_arguments``
returns the same pairs, computed once. ``activate`` replaces pyinfra 3.10.0's function (by its bytecode)
in the two modules that call it; another version keeps its own. tests/test_argtypes.py checks both give
the same list.
"""

from __future__ import annotations

import functools

import pyinfra.api.arguments as pyinfra_arguments
import pyinfra.api.facts as pyinfra_facts

from .oporder import code_digest

# pyinfra 3.10.0's all_global_arguments, by its bytecode: another version keeps its own
UPSTREAM_CODE = "50d8129ad09e952c"
_upstream = pyinfra_arguments.all_global_arguments


@functools.cache
def _pairs() -> tuple:
    return tuple(_upstream())


def cached_global_arguments() -> list[tuple[str, type]]:
    """pyinfra 3.10 ``all_global_arguments``: (name, type) of every global argument, a new list each call."""
    return list(_pairs())


def activate() -> bool:
    """Use ``cached_global_arguments`` for this run; False (and pyinfra's own) on another pyinfra."""
    if pyinfra_arguments.all_global_arguments is cached_global_arguments:
        return True
    if code_digest(_upstream) != UPSTREAM_CODE:
        return False
    pyinfra_arguments.all_global_arguments = cached_global_arguments
    pyinfra_facts.all_global_arguments = cached_global_arguments
    return True
