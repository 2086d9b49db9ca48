"""Dynamo's lazily built tables of torch functions, kept free of the step's stand-ins.

Dynamo decides how to trace a call by looking its id up in tables it builds on first use
(`trace_rules.get_torch_obj_rule_map`, the `FunctionIdSet`s of allowed and builtin functions) and then keeps.
A CPU scan's step runs with `torch.arange`, `torch.zeros`, ... patched (audit.scan.standins.pinned): if the step itself
compiles (a library's `torch.compile`d function) the tables are built from the stand-ins, and after the scan
every later compile in the process breaks its graph on the real `torch.arange` ("marked as skipped"). So the
tables built while the stand-ins were in place are dropped when they go, to be built again from torch itself.
"""

from __future__ import annotations

import contextlib
import sys

__all__ = ["rebuilt_after"]


def _tables():
    tr = sys.modules.get("torch._dynamo.trace_rules")
    if tr is None:
        return [], []
    caches = [v for v in vars(tr).values() if callable(getattr(v, "cache_clear", None)) and hasattr(v, "cache_info")]
    ids = [v for v in vars(tr).values() if type(v).__name__ == "FunctionIdSet"]
    return caches, ids


@contextlib.contextmanager
def rebuilt_after():
    """Enter before the step's patches, so it exits after they are undone."""
    caches, ids = _tables()
    empty = {id(c) for c in caches if c.cache_info().currsize == 0}
    unset = {id(s) for s in ids if s.function_ids is None}
    try:
        yield
    finally:
        later_caches, later_ids = _tables()  # the step may have imported Dynamo
        for c in later_caches:
            if id(c) in empty or not caches:
                c.cache_clear()
        for s in later_ids:
            if id(s) in unset or not ids:
                s.function_ids = s.function_names = None
