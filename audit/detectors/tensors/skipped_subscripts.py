"""A subscript whose bound fills the dimension in some steps: torch skips the slice, so no one call varies.

`enc = self.buf[:, : self.n]` dispatches `aten.slice` while `n` is short of the buffer and only an `aten.alias`
(or nothing) when `n` fills it. Calls are aligned by op, so with the short bound the same every time
(`[2, 5, 16]`, then the whole `[2, 24, 16]`, then `[2, 5, 16]` ...) neither the slices nor the aliases change
shape, yet the statement's result does: a graph captured on one bound reads the other's rows wrongly.
Here the result of each statement's subscript (its last slice, or the alias) is compared across steps.
"""

from __future__ import annotations

from collections import defaultdict

__all__ = ["skipped_subscripts"]

_SUBSCRIPT = ("aten.slice", "aten.alias")


def _results(ctx, step) -> dict:
    """(module, code, line) -> the last slice or alias record of that statement in the step."""
    out = {}
    for r in ctx.ops(step):
        if r.op in _SUBSCRIPT and r.stack and r.outputs:
            code, line = r.stack[-1]
            out[(r.module, id(code), line)] = r
    return out


def skipped_subscripts(ctx, reported: set) -> list:
    """dynamic-shape findings for statements whose subscript ran as a slice in some steps and as an alias in
    others, with a result of another shape; `reported`: site keys already reported as dynamic-shape."""
    per = defaultdict(list)
    for s in ctx.complete:
        for key, r in _results(ctx, s).items():
            per[key].append(r)
    out = []
    for recs in per.values():
        ops = {r.op for r in recs}
        shapes = [tuple(r.outputs[0].shape) for r in recs]
        if len(recs) < 2 or ops != set(_SUBSCRIPT) or len(set(shapes)) < 2 or \
                len({tuple(r.inputs[0].shape) for r in recs if r.inputs}) != 1:
            continue  # (a source of other shapes: the shape varied upstream, reported there)
        at = next(r for r in recs if r.op == "aten.slice")
        if ctx.site_key(at) in reported:
            continue
        shown = " -> ".join(str(list(s)) for s in shapes[:4]) + (" -> ..." if len(shapes) > 4 else "")
        out.append(ctx.finding("dynamic-shape", at, at.op, 1.0,
                               f"output shape changes between steps: {shown} (the slice covers the whole "
                               "dimension in some steps, where torch skips it)"))
    return out
