"""A module hook that ran on other modules in two steps: the hook's ops moved, no branch of the step chose.

Activation steering registers a forward hook on the request's layer between generations (`handle.remove()`,
then `self.layers[k].register_forward_hook(self._steer)` in prepare()). The step's own code runs the same
lines in every step; torch runs the hook after another layer, so its ops sit at another place in the op
sequence. Aligned op by op, that looks like one step running the other's layer ops "extra", and the nearest
source structure is the layer loop, which decided nothing. A graph replays the hook where capture found it:
the hook is the place to name, with the modules it ran on in each step. The tracer notes the hooks of every
hooked module call (`trace.hook_calls`), which is how a hook's frame is told from a helper's.
"""

from __future__ import annotations

from collections import defaultdict

from audit.scan.patches import module_hooks


def _placements(ctx, step: int) -> dict:
    """hook function code -> the names of the modules whose calls ran it in the step."""
    calls = ctx.trace.hook_calls[step] if step < len(ctx.trace.hook_calls) else ()
    names = {id(o): p for p, o in ctx.trace.objects}
    out = defaultdict(set)
    for hooks, mod, _stack in calls:
        for fn in map(module_hooks.function_of, hooks):
            code = getattr(fn, "__code__", None)
            if code is not None and id(mod) in names:
                out[code].add(names[id(mod)])
    return out


def _ran(ctx, step: int) -> set:
    """Names of the modules that ran ops in the step (and their parents)."""
    out = set()
    for r in ctx.ops(step):
        parts = (r.module or "").split(".")
        out.update(".".join(parts[:k]) for k in range(1, len(parts) + 1))
    return out


def moved(ctx, s0: int, s1: int) -> dict:
    """hook code -> (modules it ran at in s0, in s1), for the hooks that one step ran at a module the other step
    called without running the hook there: the hook was registered elsewhere, not the module call skipped (an
    expert the data did not pick takes its hooks with it; a process-wide hook runs at every call)."""
    p0, p1 = _placements(ctx, s0), _placements(ctx, s1)
    r0, r1 = _ran(ctx, s0), _ran(ctx, s1)
    out = {}
    for code in p0.keys() | p1.keys():
        m0, m1 = p0.get(code, set()), p1.get(code, set())
        if (m0 - m1) & r1 or (m1 - m0) & r0:
            out[code] = (sorted(m0), sorted(m1))
    return out


def hook_frame(rec, codes):
    """(code, line) of the outermost frame of `rec` that runs one of the hooks in `codes`, or None."""
    return next(((c, line) for c, line in rec.stack if c in codes), None)


def split(recs: list, tokens: list, codes) -> tuple:
    """(the records outside the moved hooks, their tokens, the first record inside one or None)."""
    keep = [k for k, r in enumerate(recs) if not hook_frame(r, codes)]
    inside = next((r for r in recs if hook_frame(r, codes)), None)
    return [recs[k] for k in keep], [tokens[k] for k in keep], inside


def message(code, where: tuple, s0: int, s1: int) -> str:
    m0, m1 = (", ".join(m) or "no module" for m in where)
    return (f"the module hook `{code.co_name}` ran at other module calls between steps {s0} and {s1}: {m0} vs {m1}"
            " (registered or moved outside the step)")
