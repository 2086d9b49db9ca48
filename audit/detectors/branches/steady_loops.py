"""A loop whose trip count stayed the same while its body's `if` chose differently.

`for b in range(B): if self.done[b]: self.state[b].zero_()` resets other rows in other steps. The
sequence alignment cuts across the loop when the extra ops sit in another iteration, so the loop line
is blamed beside the `if` in its body. When the `if`'s own test (a statement of the loop body, run once
per iteration) ran the same number of ops in every audited step, the loop went round equally often in
every step: the `if` decided, and the loop's finding folds into it (fork_keys.fold_loops_into_guards),
also when only the loop was blamed (the differing ops sit inside that `if`).
A loop whose trip count moved (`for b in range(self.n_active)`) runs that test a different number of
times and keeps its own finding. An `if` on a host value (`if last_was_timestamp:` after a `.tolist()`) runs no
op in its test; then the loop body's first statement, which runs once per iteration whatever the `if`s choose,
counts the trips instead when it runs ops (`sampled = tokens[k, start:]`).
"""

from __future__ import annotations

import ast

from audit.detectors.source import lookup
from audit.scan.sources.ast_nodes import nodes_of
from audit.scan.sources.frame_source import tree

__all__ = ["steady_body_ifs", "nested_bodies", "trips_held"]


def _loop(filename: str, line: int):
    t = tree(filename)
    return next((n for n in nodes_of(t, (ast.For, ast.AsyncFor, ast.While)) if n.lineno == line),
                None) if t is not None else None


def _body_ifs(loop) -> dict[int, tuple[int, int, int]]:
    """`if` statements that are direct statements of the loop's body:
    {if line: (first, last) line of its test, last line of the statement}."""
    return {n.lineno: (n.test.lineno, n.test.end_lineno or n.test.lineno, n.end_lineno or n.lineno)
            for n in loop.body if isinstance(n, ast.If)}


def _trip_counts(ctx, filename: str, loop) -> list[int]:
    """Per complete step, the ops and host reads of the body's first statement (run once per iteration:
    `ids = row.tolist()` counts too), or [] when it is compound (its own arms may run or not)."""
    first = loop.body[0]
    if isinstance(first, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try)):
        return []
    return _test_counts(ctx, filename, first.lineno, first.end_lineno or first.lineno, reads=True)


def _test_counts(ctx, filename: str, lo: int, hi: int, reads: bool = False) -> list[int]:
    """Per complete step, the ops (and with `reads`, the host reads) run while a frame of `filename` stood on
    lines lo..hi."""
    def counted(s):
        return ctx.ops(s) + ([r for r in ctx.steps[s] if r.kind == "host"] if reads else [])
    return [sum(1 for r in counted(s) if any(c.co_filename == filename and lo <= ln <= hi for c, ln in r.stack))
            for s in ctx.complete]


def steady_body_ifs(ctx, filename: str, line: int) -> dict[int, int]:
    """The body-level `if`s of the loop on `line` whose test ran equally often (and at all) in every complete
    step, {if line: last line of the if}: the loop's trip count did not change, so such an `if` decided
    (guard clauses, which lookup.loop_guards names, fold without this check)."""
    out = {}
    loop = _loop(filename, line)
    if loop is None:
        return out
    guards = lookup.loop_guards(filename, line)
    trips = None
    for at, (lo, hi, end) in _body_ifs(loop).items():
        if at in guards:
            continue
        counts = _test_counts(ctx, filename, lo, hi)
        if counts and not any(counts):  # a test on host values: the first statement counts the trips
            counts = trips = _trip_counts(ctx, filename, loop) if trips is None else trips
        if counts and counts[0] > 0 and len(set(counts)) == 1:
            out[at] = end
    return out


def nested_bodies(filename: str, line: int) -> dict[int, tuple[int, int]]:
    """The decisions nested anywhere in the body of the loop on `line` (`if`, `for`, `while`), {their line:
    (first, last) line of what they run}: their tests and headers excluded, so an op there is one the
    decision let run, not the test that made it."""
    loop = _loop(filename, line)
    if loop is None:
        return {}
    out = {}
    for n in ast.walk(loop):
        if n is not loop and isinstance(n, (ast.If, ast.For, ast.AsyncFor, ast.While)) and n.body:
            out[n.lineno] = (n.body[0].lineno, n.end_lineno or n.lineno)
    return out


def trips_held(ctx, filename: str, line: int) -> bool:
    """The loop's body ran its first statement equally often, and at all, in every complete step: its trip count
    held (False when that statement runs no op or host read, or is compound, so the trips cannot be counted)."""
    loop = _loop(filename, line)
    counts = _trip_counts(ctx, filename, loop) if loop is not None else []
    return bool(counts) and counts[0] > 0 and len(set(counts)) == 1
