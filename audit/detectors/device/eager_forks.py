"""Forks between two steps that a capture never takes: decided by code a capture skips.

transformers decides whether SDPA may drop the attention mask by reading it (`fast_all(padding_mask)`), behind
`if exporting() or (mask is not None and is_tracing(mask)): return False`. Eagerly, steps with and without
padding build the mask or not, and attention then runs another path (`use_gqa_in_sdpa(attention_mask, ...)`);
a capture always exits early, builds the mask, and replays that one path for any data. A fork named at a line
a capture never runs (`capture_guards.capture_guard`) is such a decision, and the forks after it in the same
pair of steps follow from it: they are listed as info, naming the decision.
"""

from __future__ import annotations

from audit.detectors.device import capture_guards


def eager_only(forks: list, rel=str) -> list:
    """For the forks of one pair of steps, in op order (each (where, caller, frames, own): the named branch, the
    target's frame that led there, the innermost frames of the first differing ops, whether the branch is the
    target's own): the guarded decision each one follows from (`file:line`, the guard's test), or None where a
    capture takes it too."""
    out, seen = [], None
    for where, caller, frames, own in forks:
        if own:
            out.append(None)
            continue
        for file, line, _fn in ((where,) + tuple(frames)) if seen is None else ():
            if file and line and (guard := capture_guards.capture_guard(file, line)):
                seen = (f"{rel(file)}:{line}", guard, caller)
                break
        out.append(seen[:2] if seen is not None and seen[2] == caller else None)
    return out


def message(decision) -> str:
    where, guard = decision
    return (f"; it follows from an eager-only decision at {where}, which a capture skips (`{guard}`): a capture "
            "records the path that skip takes, for any data")
