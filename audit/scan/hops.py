"""Higher-order operators (`torch.cond`, `while_loop`, `flex_attention`, ...) reaching the tracer's mode.

torch hands a higher-order operator to a user TorchDispatchMode only when the mode says it supports them;
otherwise it raises NotImplementedError, and the scan would stop at the line that called `torch.cond`.
The tracer's mode says it does, and runs them here, popped from the mode stack as torch leaves it: the
operator's eager implementation runs. That is what the step does on a GPU too: eagerly, `torch.cond` with
a tensor predicate decides with `if pred:` on the host (a host read, reported by the `__bool__` hook at
the caller's line), and `while_loop` reads its condition the same way. The branches and the loop body of
those two run with the mode pushed again, so their ops are the step's ops. Other operators' own inner ops
run untraced, but the Python functions the step hands them (flex_attention's `score_mod` and the `mask_mod`
at the end of its block-mask tuple) run with the mode pushed again too (`_user_callables`): they are the
user's code, which a GPU compiles into the kernel with every Python value they close over baked in as a
constant (a softcap read from a Python float that changes per step is a baked-host-value at the score_mod's
line). The operator itself is one op record (`higher_order.<name>`), its outputs made in the step.

torch calls these operators eagerly through `torch.compile(..., fullgraph=True)` (cond, flex_attention), and
dynamo skips every frame while a dispatch mode is active, so fullgraph raises ("found no compiled frames").
During an audited step compiled code therefore runs its Python source (`eager_compiled`): what dynamo does
under the mode anyway for the user's own `torch.compile`d functions, now without that error and without
code compiled in warmup bypassing the tracer.
"""

from __future__ import annotations

import contextlib
import types

import torch
from torch._C._functorch import get_unwrapped, is_batchedtensor
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


def _plain_callable(a) -> bool:
    """A Python function or method the user wrote (not a tensor, a torch module or an op)."""
    fn = getattr(a, "func", a)  # functools.partial
    return isinstance(fn, (types.FunctionType, types.MethodType))


def _physical(t):
    """The tensor under vmap's batched wrappers (what the ops inside the callable read)."""
    while is_batchedtensor(t):
        t = get_unwrapped(t)
    return t


def _user_fn(mode, fn, own: set):
    """fn run under the mode; the tensors the operator hands it and did not receive (flex_attention's score
    matrix, its index aranges) are made in the step, as the operator's outputs are."""
    tracer = mode.tracer

    def traced(*args, **kwargs):
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, torch.Tensor):
                m = tracer._meta(_physical(a))
                if m.sid not in own:
                    tracer.trace.born.setdefault(m.sid, (tracer._step, len(tracer._records)))
                    tracer._produced.add(m.tid)
        with mode:
            return fn(*args, **kwargs)

    return traced


def _user_callables(mode, args: tuple) -> tuple:
    """The operator's arguments with each plain Python callable, also one level inside a tuple or list
    (flex_attention's block mask is a tuple ending in its mask_mod), wrapped to run under the mode."""
    tensors = [t for a in args for t in (a if isinstance(a, (tuple, list)) else (a,)) if isinstance(t, torch.Tensor)]
    own = {mode.tracer._meta(t).sid for t in tensors}

    def wrap(a):
        if _plain_callable(a):
            return _user_fn(mode, a, own)
        if isinstance(a, (tuple, list)) and any(_plain_callable(x) for x in a):
            return type(a)(_user_fn(mode, x, own) if _plain_callable(x) else x for x in a)
        return a

    return tuple(wrap(a) for a in args)


def is_hop(func) -> bool:
    return isinstance(func, HigherOrderOperator)


def run(mode, func, args, kwargs):
    """Runs one higher-order operator for the tracer's mode (already popped) and records it."""
    kwargs = kwargs or {}
    name = getattr(func, "_name", None) or getattr(func, "__name__", "hop")
    if name in _TRACED_BODIES:
        args = tuple(_with_mode(mode, a) if callable(a) and not hasattr(a, "shape") else a for a in args)
    else:
        args = _user_callables(mode, args)
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
