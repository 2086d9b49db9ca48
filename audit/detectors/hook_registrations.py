"""cpu-side-effect: module hooks registered in the step and never removed, which pile up step by step.

A debug helper that calls `mod.register_forward_hook(stats)` on every call (or a library re-attaching its
observers per forward) adds one hook per step: eager decode runs more hooks each step, more host work or
more kernels, while a capture records the hooks of its one step and a replay registers nothing. The
module's hook table is torch state no snapshot compares, so the registrations are recorded where they are
made (audit/scan/patches/hook_registry.py). A site counts when two or more of its registrations were still in
place after the scan: a hook registered and removed within the step (a temporary hook), or one that
replaces the previous step's (`self.h.remove(); self.h = m.register_forward_hook(f)`), leaves one at most.
"""

from __future__ import annotations

from audit.detectors import register
from audit.scan.patches.hook_registry import KIND, alive

FIX = ("Register the hook once, outside the step (in make()), or remove its handle before the step ends "
       "(`h = m.register_forward_hook(f)` ... `h.remove()` in a finally).")


@register("cpu-side-effect")
def hooks_piling_up(ctx):
    """Hook registrations of the step whose handles stay registered, two or more from one line."""
    recs = [r for r in ctx.all_records((KIND,)) if r.stack]
    out = []
    for (_, _, op, _), group in ctx.per_site(recs).items():
        kept = [r for r in group if alive(r)]
        if len(kept) < 2:
            continue
        owner = kept[0].note or "a module"
        msg = (f"`{op}` on `{owner}` in the step, never removed: {len(kept)} of its hooks were still registered "
               f"after {ctx.n_steps} audited steps, one more runs each step; a capture records the hooks of its "
               "step, and a replay registers nothing")
        out.append(ctx.finding("cpu-side-effect", kept[0], op, len(kept) / ctx.n_steps, msg, fix=FIX))
    return out
