"""rng: random number generation inside the step.

torch registers the default CUDA generator with a graph being captured, so replay draws fresh
numbers (from a different stream than eager: bitwise replay checks must account for it). Any other
generator (`generator=`) must be registered with graph.register_generator_state, or capture raises
(CUDAGeneratorState::increase: "Attempt to increase offset for a CUDA generator not in capture mode").
"""

from __future__ import annotations

import ast

import torch

from audit.detectors import register
from audit.detectors.state import registered_gens
from audit.scan.sources.ast_nodes import all_nodes
from audit.scan.patches.seed_hooks import BY_VALUE

_SEEDED = torch.Tag.nondeterministic_seeded


def _generator(rec):
    """('generator', device, is_default) from the normalized kwargs, or None."""
    for a in rec.args:
        if isinstance(a, tuple) and len(a) == 2 and a[0] == "generator" and isinstance(a[1], tuple):
            return a[1]
    return None


def _arg(rec, name: str):
    """The value `name` had in this call: positional, keyword, or the schema's default (None if unknown)."""
    schema = rec.func._schema.arguments
    for i, a in enumerate(schema):
        if a.name != name:
            continue
        if i < len(rec.args) and not (isinstance(rec.args[i], tuple) and len(rec.args[i]) == 2
                                      and isinstance(rec.args[i][0], str)):
            return rec.args[i]
        kw = dict(x for x in rec.args if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str))
        return kw.get(name, a.default_value if a.has_default_value() else None)
    return None


def _draws(rec) -> bool:
    """Seeded ops that draw nothing in this call: attention or dropout with p = 0, dropout with train off."""
    names = {a.name for a in rec.func._schema.arguments}
    if "train" in names and _arg(rec, "train") is False:
        return False
    for key in ("dropout_p", "p"):
        if key in names and "dropout" in (rec.op + " " + " ".join(names)):
            return _arg(rec, key) not in (0, 0.0)
    return True


@register("rng")
def random_ops(ctx):
    """Ops tagged nondeterministic_seeded (randn, bernoulli_ behind dropout, multinomial, ...)."""
    recs = [r for r in ctx.all_records() if not r.nested and r.func is not None and _SEEDED in r.func.tags
            and _draws(r)]
    out = []
    for (_, _, op, _), group in ctx.per_site(recs).items():
        gen = _generator(group[0])
        reg = registered_gens.registered(ctx, group[0]) if gen is not None and not gen[2] else None
        if reg is not None:
            out.append(ctx.finding(
                "rng", group[0], op, len(group) / ctx.n_steps,
                f"`{op}` draws from an explicit generator (`{reg[0]}`) that the target registers with its graph "
                f"({ctx.rel(reg[1])}:{reg[2]}, register_generator_state): captured, each replay advances its offset"))
        elif gen is not None and not gen[2]:
            out.append(ctx.finding(
                "rng", group[0], op, len(group) / ctx.n_steps,
                f"`{op}` draws from an explicit generator ({gen[1]}): unless it is registered with the graph, "
                "capture raises (a CUDA generator refuses to advance its offset while a graph it does not know "
                "is captured)", severity="blocks-capture",
                fix="graph.register_generator_state(gen) before capture, or sample outside the step into a "
                    "static buffer."))
        else:
            out.append(ctx.finding(
                "rng", group[0], op, len(group) / ctx.n_steps,
                f"`{op}` draws random numbers inside the step (default generator: captured with a philox "
                "offset, so replay differs from eager)"))
    return out


# CUDAGeneratorImpl::set_current_seed under capture: a seed other than the generator's raises; the same seed
# is a no-op that leaves the philox offset alone, so eager repeats its numbers each step and a replay does not
_UNDER_CAPTURE = ("on a CUDA generator, capture raises for a seed other than the generator's, and the same seed is "
                  "a no-op there (the offset is not reset): eager repeats its numbers each step, a replay moves on")
_SEED_FIX = ("Seed once outside the step; per-request randomness: a generator per request, registered with the "
             "graph, or noise drawn in prepare() into a static buffer.")


def _one_seed(records) -> str | None:
    """The seed, when every reseed of the steps set the default generator to one and the same value (then
    capture passes, each reseed a no-op); None when any passed another value, or one of unknown value."""
    notes = {r.note if r.op in BY_VALUE else "" for r in records}
    return notes.pop().removeprefix("seed=") if len(notes) == 1 and "" not in notes else None


@register("rng")
def reseeding(ctx):
    """torch.manual_seed / set_rng_state inside the step. Judged by the values the steps passed: the
    same seed every time passes capture and makes a replay draw other numbers than eager (silent);
    anything else raises during capture."""
    records = list(ctx.all_records(("seed",)))
    same = _one_seed(records)
    out = []
    for (_, _, op, _), g in ctx.per_site(records).items():
        if same is not None:
            out.append(ctx.finding(
                "rng", g[0], op, len(g) / ctx.n_steps,
                f"`{op}({same})` reseeds the default generator with the same seed every step: on a CUDA generator "
                "that is a no-op under capture (the philox offset is not reset), so eager draws the same numbers "
                "each step and each replay draws new ones", severity="silent-corruption", fix=_SEED_FIX))
        else:
            out.append(ctx.finding("rng", g[0], op, len(g) / ctx.n_steps,
                                   f"`{op}()` reseeds a generator inside the step: {_UNDER_CAPTURE}",
                                   severity="blocks-capture", fix=_SEED_FIX))
    return out


_TORCH_SEEDERS = ("torch", "torch.cuda", "torch.random")  # reseeding through these is hooked (`reseeding`)
_PY_RANDOM = ("random", "np.random", "numpy.random")  # Python's and numpy's global generators: not torch's


def _reseeds(node) -> bool:
    """`gen.manual_seed(s)`, `gen.set_state(st)`, or `gen.seed()`: a fresh nondeterministic seed drawn
    into the generator (per-request entropy); `random.seed()` / `np.random.seed()` are not torch's."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    recv = ast.unparse(node.func.value)
    if recv in _TORCH_SEEDERS:
        return False
    if node.func.attr in ("manual_seed", "set_state"):
        return True
    return node.func.attr == "seed" and not node.args and not node.keywords and recv not in _PY_RANDOM


@register("rng")
def generator_reseeding(ctx):
    """`gen.manual_seed(...)` / `gen.set_state(...)` / `gen.seed()` on a generator object inside the step (a
    per-request generator reseeded every token): a C method, so no hook sees it; found in the source
    of the functions that ran in the step, the target's own and library code (with the target's line
    that called into it as the caller). A CUDA generator refuses it during capture."""
    from audit.detectors.source import lookup

    # Library code that ran is read too (a serving library's sampler reseeding a per-request generator
    # every step blocks capture wherever it lives); its finding names the target's line that called it.
    ran, via = set(), {}
    for recs in ctx.steps:
        for r in recs:
            for code, _ in r.stack:
                key = (code.co_filename, code.co_name, code.co_firstlineno)
                ran.add(key)
                via.setdefault(key, r)
    out = []
    for file, fn, first in sorted(ran):
        t = lookup.tree(file)
        for func in (() if t is None else all_nodes(t)):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or func.name != fn or \
                    min([func.lineno] + [d.lineno for d in func.decorator_list]) != first:
                continue  # only the function that ran (a same-named one elsewhere in the file did not)
            for node in ast.walk(func):
                if _reseeds(node):
                    out.append(ctx.finding(
                        "rng", (file, node.lineno, fn), f"Generator.{node.func.attr}", 1.0,
                        f"`{ast.unparse(node.func)}()` reseeds a generator inside the step: {_UNDER_CAPTURE}",
                        severity="blocks-capture", caller=ctx.caller_into(via[(file, fn, first)], file, fn),
                        fix="Seed the generator once outside the step (prepare() or request setup) and register "
                            "it with the graph, or draw the per-step noise in prepare() into a static buffer."))
    return out
