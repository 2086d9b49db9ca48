"""data-dependent-control: an `if` whose two arms call the same thing decides how it is called, not whether.

transformers' `LogitsProcessorList.__call__` runs each processor from inside `if len(args) > 2: scores =
processor(ids, scores, **kwargs) else: scores = processor(ids, scores)`. Whichever arm a processor takes, it is
called: the `if` cannot be why one step ran a processor's ops and the other did not. When a processor runs ops
in one step and none in the other (a custom processor masking EOS only `if self.calls <= self.n_calls:`, the
first of the list, so no op of its own ran before the branch), the two steps went on from the same call line,
and the loop-body guard rule would take that `if` for the switch of a processor toggled per request. Such an
`if` is no guard, and the decision lies inside the callee, at its own branch (`entered_callee`).
"""

from __future__ import annotations

import ast
import itertools

from audit.detectors.source import lookup

__all__ = ["calls_either_way", "entered_callee"]


def _dump(n) -> str:
    return ast.dump(n, annotate_fields=False, include_attributes=False)


def _callees(stmts, line=None) -> set:
    """The called expressions (dumped) of the calls in `stmts`, only those starting on `line` when given."""
    return {_dump(c.func) for s in stmts for c in ast.walk(s)
            if isinstance(c, ast.Call) and (line is None or c.lineno == line)}


def calls_either_way(node, line: int) -> bool:
    """`node` is an `if` with both arms, one holding `line`, and the other arm calls a callee of a call on `line`
    (the same name or attribute chain): both ways the call is made."""
    if not isinstance(node, ast.If) or not node.orelse:
        return False
    arms = (node.body, node.orelse)
    here = next((a for a in arms if any(lookup._span(s, line) for s in a)), None)
    if here is None:
        return False
    other = arms[1] if here is arms[0] else arms[0]
    mine = _callees(here, line)
    return bool(mine) and bool(mine & _callees(other))


def entered_callee(x, nxt):
    """(code, line) of the branch inside the call that ran the extra ops `x`, when the other step went on with
    `nxt` from the same line of the same frames and that line sits in an `if` that makes the call either way
    (calls_either_way): both steps made the call, and in the callee (outermost frame first) the branch between
    its start and x's line decided; None otherwise."""
    if x is None or nxt is None:
        return None
    shared = list(itertools.takewhile(lambda f: f[0][0] is f[1][0] and f[0][1] == f[1][1], zip(x.stack, nxt.stack)))
    d = len(shared)
    if d == 0 or d >= len(x.stack):
        return None
    code, line = x.stack[d - 1]
    func = lookup.enclosing_function(code.co_filename, line)
    if func is None or isinstance(func, ast.Module) or \
            not any(calls_either_way(n, line) for n, _ in lookup.chain(func, line)):
        return None
    for c, lx in x.stack[d:]:
        found = lookup.decider(c.co_filename, None, lx)
        if found:
            return c, found
    return None
