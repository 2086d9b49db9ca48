"""A second decision in one differing region: an early exit after the guarded block the first one chose.

A compressor that emits every `ratio` positions writes its state, then `if should_compress:` pools the window,
and further down `if not should_compress: return` skips the normalisation, rotary and cache write. On the
emitting step both blocks run back to back, so the two steps differ in one contiguous region, which the
divergence rule blames on its first op's branch, the `if should_compress:`. Removing that branch (pooling every
step and selecting on the device) leaves the early return deciding the rest: it is a host decision of its own.
When the extra ops of a region leave the body of the branch blamed for them and go on, in the same call, past
a later branch that can leave the function early, while the other step ran nothing more in that call, that
exit is reported too.
"""

from __future__ import annotations

import ast

from audit.detectors.source import lookup


def _branch_node(filename: str, line: int):
    func = lookup.enclosing_function(filename, line)
    if func is None or isinstance(func, ast.Module):
        return None
    return next((n for n in ast.walk(func) if isinstance(n, ast.If) and n.lineno == line), None)


def _depth(x, where) -> int | None:
    """Stack depth of the frame of `x` that runs `where`'s function (innermost such frame)."""
    file, _, fn = where
    for d in range(len(x.stack) - 1, -1, -1):
        code, _ = x.stack[d]
        if code.co_filename == file and code.co_name == fn:
            return d
    return None


def later_exit(where, extra: list, nxt) -> tuple[int, tuple] | None:
    """(index in `extra`, (file, line, function)) of an early-exit branch the extra ops ran past after leaving
    the body of the `if` at `where` in the same call, which the other step (going on with `nxt`) took; or None."""
    if where is None or not extra:
        return None
    node = _branch_node(where[0], where[1])
    d = _depth(extra[0], where) if node is not None else None
    if d is None or not node.lineno <= extra[0].stack[d][1] <= (node.end_lineno or node.lineno):
        return None
    call = extra[0].stack[: d + 1]
    for k, x in enumerate(extra):
        if len(x.stack) <= d or x.stack[:d] != call[:d] or x.stack[d][0] is not call[d][0]:
            return None  # the extra ops left this call: the rest is decided elsewhere
        line = x.stack[d][1]
        if line <= (node.end_lineno or node.lineno):
            continue
        exit_line = lookup.exit_branch(where[0], node.end_lineno + 1, line)
        if exit_line is None or exit_line == node.lineno:
            return None
        if nxt is not None and len(nxt.stack) > d and nxt.stack[:d] == call[:d] and nxt.stack[d][0] is call[d][0] \
                and nxt.stack[d][1] > exit_line:
            return None  # the other step went on past the exit in this call: it did not leave there
        return k, (where[0], exit_line, where[2])
    return None
