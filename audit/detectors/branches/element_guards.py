"""data-dependent-control: a loop over items whose body guards the item's call with a test of the item itself.

`for f in filters: if f.enabled: logits = f(logits, tokens)` with the last filter switched off in one step: the
other step's next op comes after the loop, so the ops alone cannot tell "the loop ran one more time" from "the
`if` skipped the last item" (control.py names the loop when a call is re-entered from the same line). The test
reading the loop's own element (`f.enabled`, `p.should_apply(x)`, `layer.active`) is a per-item switch: the
loop visits every item either way and the `if` chooses, so that `if` is named. A loop with no such guard (a list
filtered per request, `for p in active: ...`, or `self.layers[: self.depth]`) keeps the loop.
"""

from __future__ import annotations

import ast

from audit.detectors.branches import key_tests
from audit.detectors.source import lookup
from audit.scan.sources.ast_nodes import all_nodes


def element_guard(filename: str, loop_line: int, line: int) -> int | None:
    """The `if` inside the `for` loop starting at `loop_line` that holds `line` (no `else`) and whose test
    reads the loop's target name; None when there is none."""
    t = lookup.tree(filename)
    loop = next((n for n in all_nodes(t) if isinstance(n, (ast.For, ast.AsyncFor)) and n.lineno == loop_line),
                None) if t is not None else None
    if loop is None or not any(s.lineno <= line <= (s.end_lineno or s.lineno) for s in loop.body):
        return None
    names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    guards = [n for n in ast.walk(loop) if isinstance(n, ast.If) and not n.orelse
              and any(s.lineno <= line <= (s.end_lineno or s.lineno) for s in n.body)
              and names & {x.id for x in ast.walk(n.test) if isinstance(x, ast.Name)}
              and not key_tests.fixed_key_test(lookup.enclosing_function(filename, line), n)]
    return max((g.lineno for g in guards), default=None)  # the innermost such `if`
