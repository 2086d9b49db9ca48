"""A move that is stored back where it came from: `qs.absmax = qs.absmax.to(x.device)`.

A quantizer's state kept on the host while the model is built (bitsandbytes' QuantState, a scale table in a
plain object) is often moved lazily by the forward itself, the moved tensor assigned back to the attribute
it was read from. On a GPU the first (warm-up) call copies it; from then on the attribute holds the device
tensor and `.to(<its device>)` returns it as it is, copying nothing. Only a move whose result goes elsewhere
(`absmax = qs.absmax.to(x.device)`, the attribute left on the host) copies on every call. On a CPU scan both
are the same no-op, so the source tells them apart."""

from __future__ import annotations

import ast

from audit.scan.sources.ast_nodes import nodes_of
from audit.scan.sources.frame_source import tree

MOVES = ("to", "cuda")  # the methods that send a tensor to a device


def stored_back(filename: str, line: int) -> bool:
    """The statement at `line` assigns `<x>.<attr>.to(...)` (or `.cuda(...)`) to `<x>.<attr>` itself, the
    receiver and the target written alike (`self.w = self.w.to(dev, non_blocking=True)`)."""
    t = tree(filename)
    for node in nodes_of(t, (ast.Assign, ast.AnnAssign)) if t is not None else ():
        if not node.lineno <= line <= (node.end_lineno or node.lineno) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        v = node.value
        if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in MOVES and \
                isinstance(v.func.value, ast.Attribute):
            src = ast.unparse(v.func.value)
            if any(isinstance(x, ast.Attribute) and ast.unparse(x) == src for x in targets):
                return True
    return False
