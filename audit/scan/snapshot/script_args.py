"""Comparable values for the TorchScript objects a collective takes as arguments.

`dist.all_reduce(x, op=..., group=...)` dispatches `c10d.allreduce_(tensors, process_group, reduce_op, ...)`: the
group and the reduce op reach the dispatcher as `torch.ScriptObject`s, which the trace would keep only by their type
name, so a step that picks another group (`self.groups[self.mode]`) or another op (`ReduceOp.MAX` one step,
`SUM` the next) looked like the same call. A graph bakes both: replay runs the captured collective on the captured
communicator with the captured op. They are kept by what they are instead: a ReduceOp by its op (`ReduceOp.MAX`;
a fresh object per call, so never by identity), a ProcessGroup by its name (`ProcessGroup 'tp'`), which the
group keeps for its lifetime. Any other object stays its type name.
"""

from __future__ import annotations

import torch

__all__ = ["value"]


def value(a):
    """A hashable, comparable stand-in for a non-tensor argument the tracer has no atom for."""
    if isinstance(a, torch.ScriptObject):
        got = _script(a)
        if got is not None:
            return got
    return type(a).__name__


def _script(a) -> str | None:
    try:
        name = a._type().qualified_name()
    except Exception:  # noqa: BLE001 - an object with no TorchScript type
        return None
    try:
        if name.endswith("c10d.ReduceOp"):
            return f"ReduceOp.{_op_name(a.op())}"
        if name.endswith("c10d.ProcessGroup"):
            import torch.distributed as dist

            return f"ProcessGroup {dist.ProcessGroup.unbox(a).group_name!r}"
    except Exception:  # noqa: BLE001 - a build without these methods: the type name, as before
        return None
    return None


def _op_name(op: int) -> str:
    try:
        import torch.distributed as dist

        return dist.ReduceOp.RedOpType(op).name
    except Exception:  # noqa: BLE001
        return str(op)
