"""cpu-side-effect: a draw from a process-wide host generator (`random.random()`, `np.random.uniform(...)`).

Those generators live in the stdlib's and numpy's own globals (audit/scan/process_rngs.py snapshots them): a
router's jitter or token-drop coin drawn there advances them once per eager step, and a replay never does (the
drawn value, if it feeds a device op, is also baked: baked-host-value says so). The site is the drawing call in
the code the step ran, found by reading it: a call of `random.<fn>` or `numpy.random.<fn>` through the names the
file imported; the caller is the target's line that led into that function.
"""

from __future__ import annotations

import ast

from audit.detectors import _source, register
from audit.detectors._state_sites import caller_of
from audit.scan.process_rngs import OWNER

# module attributes that make or inspect a generator: no draw from the process-wide one
_NO_DRAW = {"default_rng", "Generator", "RandomState", "Random", "SystemRandom", "SeedSequence", "getstate",
            "get_state", "BitGenerator", "PCG64", "MT19937", "Philox", "SFC64", "PCG64DXSM"}


def _aliases(filename: str) -> dict:
    """Local name -> dotted module or member path, from the file's imports."""
    t = _source.tree(filename)
    out = {}
    for n in ast.walk(t) if t is not None else ():
        if isinstance(n, ast.Import):
            for a in n.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            for a in n.names:
                out[a.asname or a.name] = f"{n.module}.{a.name}"
    return out


def _drawn_from(filename: str, call: ast.Call) -> str | None:
    """'random' / 'numpy.random' when the call draws from that process-wide generator."""
    parts = []
    f = call.func
    while isinstance(f, ast.Attribute):
        parts.insert(0, f.attr)
        f = f.value
    if not isinstance(f, ast.Name) or (head := _aliases(filename).get(f.id)) is None:
        return None
    path = ".".join([head] + parts)
    mod, _, fn = path.rpartition(".")
    return mod if mod in ("random", "numpy.random") and fn not in _NO_DRAW else None


def _draws(filename: str, func_name: str) -> tuple:
    """(line, generator module) of each draw in the functions named func_name of the file."""
    t = _source.tree(filename)
    out = []
    for fn in ast.walk(t) if t is not None else ():
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name == func_name:
            out += [(c.lineno, m) for c in ast.walk(fn) if isinstance(c, ast.Call) and (m := _drawn_from(filename, c))]
    return tuple(sorted(set(out)))


@register("cpu-side-effect")
def process_rng_draws(ctx):
    """A process-wide host generator advanced by the step: one finding per drawing call that ran."""
    out, seen = [], set()
    for s, changes in enumerate(ctx.trace.changes):
        moved = {c.attr for c in changes if c.owner == OWNER}
        if not moved:
            continue
        ran = {(code.co_filename, code.co_name) for r in ctx.steps[s] for code, _ in r.stack}
        for file, fn in sorted(ran):
            for line, mod in _draws(file, fn):
                if mod in moved and (file, line) not in seen:
                    seen.add((file, line))
                    count = sum(1 for ch in ctx.trace.changes if any(c.owner == OWNER and c.attr == mod for c in ch))
                    out.append(ctx.finding(
                        "cpu-side-effect", (file, line, fn), "mutate", count / ctx.n_steps,
                        f"draws from the process-wide `{mod}` generator: eager steps advance it, a replay never does",
                        module=OWNER, caller=caller_of(ctx, (file, line, fn), s),
                        fix="Draw on the device (torch.rand on the default CUDA generator is captured), or draw in "
                            "prepare() into a static buffer."))
    return out
