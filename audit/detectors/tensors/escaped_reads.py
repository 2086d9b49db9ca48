"""Calls that read back tensors earlier steps made: their reads of warmup-made tensors are no stale input.

A history kept on the host (`hist.pop(0); hist.append(h[row])`, then `torch.cat(hist)`) holds tensors that
earlier steps allocated. A call reading the oldest entry reads another storage every step. In the audited
steps after the window filled with traced tensors, that storage was born in an earlier audited step, which
step-allocation reports as an escape; in the first audited steps it was born in an untraced warmup step, and
looks like a persistent buffer swapped by the host. The same call, at the same input, is one hazard: the escape
(and the rotation, a cpu-side-effect), not a stale input pointer beside it.
"""

from __future__ import annotations


def reads_earlier_steps(ctx) -> set:
    """(call key, input position) of the calls that, in some audited step, read from outside the step a storage
    an earlier audited step created."""
    born, out = ctx.trace.born, set()
    for s in ctx.complete:
        for key, r in ctx.sites(s).items():
            for j, m in enumerate(r.inputs):
                made = born.get(m.sid) if j < len(r.in_step) and not r.in_step[j] else None
                if made is not None and made[0] < s:
                    out.add((key, j))
    return out
