"""A loop's line reached in another iteration each step, because a data-dependent conditional skipped some.

`for e in range(E): if not hit[e]: continue; w[e]` runs the line once per hit expert: its k-th run is
another iteration in another step, so it takes another index (a changing argument) and reads another element
of a persistent table (another storage at the same aligned call). Neither is a hazard of its own:
data-dependent-control reports the conditional, the cause, and once it is gone every step runs every iteration
with the same index and the same element. Not when the line also reads a host counter the steps advance
(`codes[j][self.frame // s]`): that value moves whichever iterations run (branches/counter_index.py).
"""

from __future__ import annotations

from audit.detectors.allocation import attribute_sids
from audit.detectors.branches.counter_index import reads_counter
from audit.detectors.branches.passed_index import passed_skipped_index
from audit.detectors.source import lookup


def diverged(ctx) -> bool:
    """The complete steps did not all run the same op sequence."""
    return len({tuple(ctx.sites(s)) for s in ctx.complete}) > 1


def skipped_iteration(ctx, rec, memo: dict, read: int = 0) -> bool:
    """Whether `rec`'s line reads the index of a loop whose conditional skips iterations before it (directly or
    as a helper's parameter), and reads no advancing host counter. `read`: the input whose holder names the
    indexed attribute (`self.dev_cache[slot]` bakes `slot` of its own however the loop skips)."""
    code_line = rec.stack[-1] if rec.stack else None
    if code_line is None:
        return False
    held = attribute_sids(ctx).get(rec.inputs[read].sid) if len(rec.inputs) > read else None
    indexed = held.rsplit(".", 1)[-1] if held and "[" not in held else None
    # the index may also reach the line as a helper's parameter (`forward_one(e, x)` reading `w1[e]`)
    skipped = lookup.skipped_loop_index(code_line[0].co_filename, code_line[1], indexed) or \
        passed_skipped_index(rec.stack)
    return skipped and not reads_counter(ctx, code_line[0].co_filename, code_line[1], memo)
