"""A layout op a torch composite picks from its operands' sizes: downstream of the operand whose shape varies.

`torch.einsum("tec,td->ecd", dispatch, x)` runs `permute`/`view` on each operand below any statement and picks the
permutation from all operands' sizes: a capacity-factor MoE whose capacity `C` follows the live requests hands it a
`dispatch` of another `C` each step, and the permute of the unchanged `x` then gets another order (a size-1 dim is
moved aside) and another output shape. Its own input kept its shape, so it read as a new origin, a dynamic-shape and
a baked-host-value at the einsum line, whose only fix is the one of the call that made `dispatch`. On a GPU,
`F.scaled_dot_product_attention` with a boolean mask whose key length grows pads the mask to an aligned width for
the memory-efficient kernel (`constant_pad_nd`) and slices it back (`slice` up to the key length): the padded mask
keeps one width over several steps, so the slice's end moved on an input of one shape, the same pattern. Such an op is
downstream when the code line writes no op of its name (torch issued it), another op of the same call run (the
same frames, before or after it) read a tensor whose shape varies between the steps, and steps whose run read the same shapes got the
same arguments and output shape: the variation is a function of the operands' sizes, not of a host value.
"""

from __future__ import annotations

import ast
from collections import defaultdict

from audit.detectors.source.lookup import tree
from audit.scan.sources.ast_nodes import all_nodes

_LAYOUT = {"permute", "view", "_unsafe_view", "reshape", "expand", "unsqueeze", "squeeze", "transpose",
           "slice", "constant_pad_nd"}
_WRITTEN = _LAYOUT | {"flatten", "unflatten", "movedim", "swapaxes", "swapdims", "t", "view_as", "reshape_as",
                      "expand_as", "rearrange", "repeat", "pad", "narrow", "chunk", "split", "tensor_split", "unbind"}
_COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.While, ast.With, ast.Try)


def follows_operand_layout(ctx, recs) -> bool:
    """`recs`: the aligned records of one call, one per step."""
    if not recs or recs[0].op.split(".")[-1] not in _LAYOUT or not recs[0].stack:
        return False
    code, line = recs[0].stack[-1]
    if _writes_op(code.co_filename, line, recs[0].op.split(".")[-1]):
        return False
    runs = [_run_shapes(ctx, r) for r in recs]
    if any(run is None for run in runs) or len(set(runs)) < 2:
        return False  # no earlier op of the call, or every step's operands had the same shapes
    by_run = defaultdict(set)
    for run, r in zip(runs, recs):
        by_run[run].add((r.args, tuple(tuple(o.shape) for o in r.outputs)))
    return all(len(v) == 1 for v in by_run.values())


def _run_shapes(ctx, r):
    """The input shapes of the other ops of `r`'s call run (the records with its frames just before and after it):
    a composite may lay out one operand before it reads the one whose size it follows (`torch.take_along_dim(seqs,
    idx[:, None], 0)` expands the index to the width of `seqs`, then expands `seqs`)."""
    recs = ctx.steps[r.step] if r.step < len(ctx.steps) else []
    if r.index >= len(recs) or recs[r.index] is not r:
        return None
    shapes = []
    for side in (reversed(recs[:r.index]), recs[r.index + 1:]):
        for q in side:
            if q.kind != "aten":
                continue
            if q.stack != r.stack:
                break
            shapes.append(tuple(tuple(m.shape) for m in q.inputs))
    return tuple(shapes) or None


def _writes_op(filename: str, line: int, op: str) -> bool:
    """The simple statement at `line` calls a layout op of its own (`x.view(...)`, `torch.permute(...)`), or, for a
    `slice`, subscripts with a slice itself (`k[:, :n]`)."""
    t = tree(filename)
    if t is None:
        return True  # no source: do not excuse
    best = None
    for n in all_nodes(t):
        if isinstance(n, ast.stmt) and not isinstance(n, _COMPOUND) and n.lineno <= line <= (n.end_lineno or n.lineno):
            best = n if best is None or n.lineno >= best.lineno else best
    if best is None:
        return True
    for c in ast.walk(best):
        if isinstance(c, ast.Slice) and op == "slice":  # `k[:, :n]` slices by itself
            return True
        if isinstance(c, ast.Call):
            f = c.func
            if (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")) in _WRITTEN:
                return True
    return False
