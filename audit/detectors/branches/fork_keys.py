"""Which finding a fork of the op sequences belongs to: its branch's line and the target's line that led
there (a library branch reached from two of the target's calls is two places to fix), and the loop whose
guard clause was blamed beside it (the guard takes the loop's regions)."""

from __future__ import annotations

from audit.detectors.branches import steady_loops
from audit.detectors.source import lookup

__all__ = ["caller_key", "fold_loops_into_guards"]


def caller_key(ctx, rec, where) -> tuple | None:
    """The target's line that led into the fork at `where`: a library branch reached from two of the
    target's lines (rotary's cached-or-computed freqs under `rotate(q, offset=pos)` and `rotate(k, ...)`)
    is two places to fix, so two findings, as `Context.per_site` keeps them apart."""
    cal = ctx.caller_into(rec, where[0], where[2])
    if cal is not None and not isinstance(cal, tuple):
        cal = ctx.caller(cal)
    return tuple(cal[:2]) if cal else None


def fold_loops_into_guards(ctx, hits: dict) -> None:
    """A loop line blamed next to a guard clause of its own body (`if ...: continue`) that was also
    blamed: the iterations differ because of the guard, so its finding takes the loop's regions
    (when a different iteration is skipped each step the alignment also cuts across the loop). So does
    an `if` of the body whose test ran equally often in every step (steady_loops: the trip count held),
    blamed or not, when the differing ops sit inside it; and, when the loop's trips held, the innermost decision
    nested deeper in the body whose body holds the differing ops (_inside_nested)."""
    for key in list(hits):
        (file, line, function), caller = key
        guards = lookup.loop_guards(file, line)
        into = next((k for k in hits if k[0][0] == file and k[0][1] in guards and k[1] == caller), None) \
            if guards else None
        if into is None:
            into = _steady_if(ctx, file, line, function, caller, hits[key], hits)
        if into is None:
            into = _inside_nested(ctx, file, line, function, caller, hits[key])
        if into is not None:
            hits.setdefault(into, []).extend(hits.pop(key))


def _steady_if(ctx, file, line, function, caller, regions, hits) -> tuple | None:
    """The key of the body `if` of the loop on `line` that ran its test equally often in every step and
    holds the differing ops of every region (a region's record stands in the file on a line of that if);
    else such an `if` blamed itself, or the only one: the trip count held, so the region the alignment started
    at the top of an iteration is that `if`'s choice seen from elsewhere."""
    spans = steady_loops.steady_body_ifs(ctx, file, line)
    for at, end in spans.items():
        if all(any(c.co_filename == file and at <= ln <= end for c, ln in r[3].stack) for r in regions):
            return (file, at, function), caller
    blamed = next((k for k in hits if k[0][0] == file and k[0][1] in spans and k[1] == caller), None)
    if blamed is None and len(spans) == 1:  # the body's one decision
        blamed = (file, next(iter(spans)), function), caller
    return blamed


def _inside_nested(ctx, file, line, function, caller, regions) -> tuple | None:
    """The key of the innermost decision nested in the body of the loop on `line` (`for tok, n in counts.items():
    if n >= k: scores[tok] -= p` under `for row in rows: ids = row.tolist()`) whose body ran every region's first
    differing op, when the loop's trip count held (steady_loops.trips_held): the alignment anchored at the loop's
    top sees the loop where the nested decision chose. None when the trips moved or cannot be counted."""
    inner = steady_loops.nested_bodies(file, line)
    if not inner or not steady_loops.trips_held(ctx, file, line):
        return None
    holding = [at for at, (lo, hi) in inner.items()
               if all(any(c.co_filename == file and lo <= ln <= hi for c, ln in r[3].stack) for r in regions)]
    return ((file, max(holding), function), caller) if holding else None
