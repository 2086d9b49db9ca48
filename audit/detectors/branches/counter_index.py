"""A skipped loop's line that also reads a host counter: its changing value is baked on its own.

baked-host-value leaves a changing argument to data-dependent-control when the line reads the index of a loop
whose conditional skips iterations (`for e in range(E): if not hit[e]: continue; w[e]`): the k-th run of the
line is another iteration in another step, and once the branch is gone every step runs every iteration with
the same index. A line that also reads a plain number the steps advance keeps a changing value after that fix:
multi-rate codes stored at `self.codes[j][self.frame // s]` under `if self.frame % s == 0:` write at another
position every step whichever iterations run, so the counter is a baked value of its own, beside the branch.
The counter is read on the line itself (`self.frame`, `cfg.pos`) or through a local the function binds from
one (`t = self.frame`).
"""

from __future__ import annotations

import ast
import numbers

from audit.detectors.source import lookup


def _number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def advanced_attrs(ctx) -> set[str]:
    """Names of the plain-number attributes the complete steps changed, or that changed between them
    (prepare() staging a step index): the host counters a line may read."""
    out = set()
    for per_step in (ctx.trace.changes, getattr(ctx.trace, "staged", [])):
        for s in ctx.complete:
            for c in per_step[s] if s < len(per_step) else ():
                if _number(c.before) and _number(c.after) and c.before != c.after:
                    out.add(c.attr)
    return out


def _reads_attr(node, attrs: set) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in attrs and isinstance(n.ctx, ast.Load)
               for n in ast.walk(node))


def reads_counter(ctx, filename: str, line: int, memo: dict) -> bool:
    """Whether `line` reads an attribute the steps advance, directly or through a local of its function
    assigned from one before it."""
    if "attrs" not in memo:
        memo["attrs"] = advanced_attrs(ctx)
    attrs = memo["attrs"]
    if not attrs:
        return False
    func = lookup.enclosing_function(filename, line)
    if func is None or isinstance(func, ast.Module):
        return False
    at = [n for n in ast.walk(func) if getattr(n, "lineno", None) == line and isinstance(n, ast.expr)]
    if any(_reads_attr(n, attrs) for n in at):
        return True
    bound = {t.id for n in ast.walk(func) if isinstance(n, ast.Assign) and n.lineno < line
             and _reads_attr(n.value, attrs) for t in n.targets if isinstance(t, ast.Name)}
    return any(isinstance(n, ast.Name) and n.id in bound and isinstance(n.ctx, ast.Load) for n in at)
