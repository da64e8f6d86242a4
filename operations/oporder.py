"""pyinfra's operation order, worked out without reading source files.

pyinfra 3.10 orders a CLI run's operations by the line numbers of the deploy code that called them
(api/util.py ``get_operation_order_from_stack``, called once per operation from
api/operation.py ``solve_operation_consistency``). It takes them from ``inspect.stack()``, which
also reads the source line of every frame of the stack (``inspect.findsource``: linecache and a
search of ``sys.modules`` per frame), and then ``getframeinfo`` once more per frame: about 3 ms per
operation at heavylift's stack depth, a tenth of a converged re-run of 28 operations.

``order_from_stack`` returns the same list from ``inspect.getframeinfo(frame, context=0)``: the same
file name (``getsourcefile`` or ``getfile``) and line (the current instruction's) of each frame,
without the source. tests/test_oporder.py checks both give the same order on real stacks. pyinfra
is pinned (pyproject.toml); ``activate`` replaces only the function of that version.
"""

from __future__ import annotations

import hashlib
import inspect
import sys

import pyinfra
import pyinfra.api.operation
import pyinfra.api.util as pyinfra_util

# the module (``pyinfra.api.operation`` as an attribute is the decorator), whose name is called
pyinfra_operation = sys.modules["pyinfra.api.operation"]

# pyinfra 3.10.0's get_operation_order_from_stack, by its bytecode: another version keeps its own
UPSTREAM_CODE = "0d346aa316922185"


def code_digest(function) -> str:
    code = function.__code__
    return hashlib.sha256(code.co_code + repr(code.co_consts).encode() + repr(code.co_names).encode()).hexdigest()[:16]


def order_from_stack(state) -> list:
    """pyinfra 3.10 ``get_operation_order_from_stack``: the line numbers of the calling frames from the
    deploy file inward, pyinfra's own frames left out, after the operation file's number in CLI mode.
    Upstream's stack starts at its own frame (pyinfra's, so never a number); this one at its caller."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()
    infos = [inspect.getframeinfo(each, context=0) for each in frames]
    del frames, frame

    start = 0
    # from the *first* frame of the deploy file, outermost first; when none is, upstream starts at the
    # innermost frame, its own, which it leaves out as pyinfra's: nothing
    if state.current_deploy_filename:
        start = next((index for index, info in enumerate(infos) if info.filename == state.current_deploy_filename),
                     len(infos))

    line_numbers = [state.current_op_file_number] if pyinfra.is_cli else []
    for info in infos[start:]:
        if info.filename.startswith(pyinfra_util.PYINFRA_INSTALL_DIR):
            continue
        line_numbers.append(info.lineno)
    return line_numbers


def activate() -> bool:
    """Use ``order_from_stack`` for this run's operations; False (and pyinfra's own) on another pyinfra."""
    if pyinfra_operation.get_operation_order_from_stack is order_from_stack:
        return True
    if code_digest(pyinfra_util.get_operation_order_from_stack) != UPSTREAM_CODE:
        return False
    pyinfra_operation.get_operation_order_from_stack = order_from_stack
    return True
