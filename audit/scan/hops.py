"""Higher-order operators (`torch.cond`, `while_loop`, `flex_attention`, ...) reaching the tracer's mode.

torch hands a higher-order operator to a user TorchDispatchMode only when the mode says it supports them;
otherwise it raises NotImplementedError, and the scan would stop at the line that called `torch.cond`.
The tracer's mode says it does, and runs them here, popped from the mode stack as torch leaves it: the
operator's eager implementation runs. That is what the step does on a GPU too: eagerly, `torch.cond` with
a tensor predicate decides with `if pred:` on the host (a host read, reported by the `__bool__` hook at
the caller's line), and `while_loop` reads its condition the same way. The branches and the loop body of
those two run with the mode pushed again, so their ops are the step's ops; other operators' inner ops
run untraced. The operator itself is one op record (`higher_order.<name>`), its outputs made in the step.

torch calls these operators eagerly through `torch.compile(..., fullgraph=True)` (cond, flex_attention), and
dynamo skips every frame while a dispatch mode is active, so fullgraph raises ("found no compiled frames").
During an audited step compiled code therefore runs its Python source (`eager_compiled`): what dynamo does
under the mode anyway for the user's own `torch.compile`d functions, now without that error and without
code compiled in warmup bypassing the tracer.
"""

from __future__ import annotations

import contextlib

import torch
from torch._ops import HigherOrderOperator

__all__ = ["eager_compiled", "is_hop", "run"]

_TRACED_BODIES = {"cond", "while_loop"}  # eager Python loops/branches over plain callables
_SHIMS: dict = {}


class _OpName:
    """What the tracer reads of an op: its namespace, name and tags (for record_op)."""

    __slots__ = ("namespace", "_opname", "tags")

    def __init__(self, name: str):
        self.namespace, self._opname, self.tags = "higher_order", name, ()


def _with_mode(mode, fn):
    def traced(*args, **kwargs):
        with mode:
            return fn(*args, **kwargs)

    return traced


def is_hop(func) -> bool:
    return isinstance(func, HigherOrderOperator)


def run(mode, func, args, kwargs):
    """Runs one higher-order operator for the tracer's mode (already popped) and records it."""
    kwargs = kwargs or {}
    name = getattr(func, "_name", None) or getattr(func, "__name__", "hop")
    if name in _TRACED_BODIES:
        args = tuple(_with_mode(mode, a) if callable(a) and not hasattr(a, "shape") else a for a in args)
    shim = _SHIMS.get(name)
    if shim is None:
        shim = _SHIMS[name] = _OpName(name)
    try:
        out = func(*args, **kwargs)
    except BaseException:
        mode.tracer.record_op(shim, args, kwargs, None, failed=True)
        raise
    mode.tracer.record_op(shim, args, kwargs, out)
    return out


@contextlib.contextmanager
def eager_compiled():
    """For one audited step: torch.compile'd functions run as the Python they were written in."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is None:
        yield
        return
    with set_stance("force_eager"):
        yield
