"""rng: random number generation inside the step.

torch registers the default CUDA generator with a graph being captured, so replay draws fresh
numbers (from a different stream than eager: bitwise replay checks must account for it). Any other
generator (`generator=`) must be registered with graph.register_generator_state, or replay repeats
the captured numbers; a CPU generator feeding a device op cannot be captured at all.
"""

from __future__ import annotations

import torch

from audit.detectors import register

_SEEDED = torch.Tag.nondeterministic_seeded


def _generator(rec):
    """('generator', device, is_default) from the normalized kwargs, or None."""
    for a in rec.args:
        if isinstance(a, tuple) and len(a) == 2 and a[0] == "generator" and isinstance(a[1], tuple):
            return a[1]
    return None


@register("rng")
def random_ops(ctx):
    """Ops tagged nondeterministic_seeded (randn, bernoulli_ behind dropout, multinomial, ...)."""
    recs = [r for r in ctx.all_records() if not r.nested and r.func is not None and _SEEDED in r.func.tags]
    out = []
    for (_, _, op), group in ctx.per_site(recs).items():
        gen = _generator(group[0])
        if gen is not None and not gen[2]:
            out.append(ctx.finding(
                "rng", group[0], op, len(group) / ctx.n_steps,
                f"`{op}` draws from an explicit generator ({gen[1]}): unless it is registered with the graph, "
                "replay repeats the numbers drawn at capture", severity="silent-corruption",
                fix="graph.register_generator_state(gen) before capture, or sample outside the step into a "
                    "static buffer."))
        else:
            out.append(ctx.finding(
                "rng", group[0], op, len(group) / ctx.n_steps,
                f"`{op}` draws random numbers inside the step (default generator: captured with a philox "
                "offset, so replay differs from eager)"))
    return out
