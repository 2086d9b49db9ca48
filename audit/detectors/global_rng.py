"""cpu-side-effect: Python's `random` module or numpy's global `np.random` drawn from in the step.

A serving library that flips a coin on the host (`if random.random() < p:` in a speculative acceptance) or
jitters a value with `np.random.rand()` advances a generator whose state lives in C inside those modules:
no attribute changes. audit.scan.snapshot.global_rng hashes both states around each step. A replay draws nothing:
the number drawn at capture is used forever, and the generator never advances. The site is the drawing
call, read from the source of the functions that ran in the step (a library's too, with the target's line
that led there as caller); a reseed in the step (`random.seed(s)`, `np.random.seed(s)`) is a site as well.
"""

from __future__ import annotations

import ast
from collections import defaultdict

from audit.detectors import register
from audit.detectors.state import called_objects
from audit.detectors.source import lookup
from audit.detectors.state.sites import _calls, called_by_name, caller_of
from audit.scan.sources import loaded
from audit.scan.sources.ast_nodes import all_nodes
from audit.scan.snapshot import global_rng
from audit.scan.sources.user_code import OWN

_NOT_DRAWS = {"getstate", "get_state", "Random", "SystemRandom", "default_rng", "RandomState", "Generator",
              "SeedSequence", "BitGenerator", "PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64",
              "get_bit_generator"}
_WHO = {"random": "Python's `random` module", "numpy.random": "numpy's global `np.random`"}


def _aliases(tree) -> dict[str, str]:
    """Local name -> 'random' | 'numpy' | 'numpy.random' | 'random.<fn>' | 'numpy.random.<fn>', from the
    file's imports (`import numpy as np`, `from random import random as coin`, `from numpy import random`)."""
    out = {}
    for node in all_nodes(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in ("random", "numpy", "numpy.random"):
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module in ("random", "numpy", "numpy.random"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full == "numpy.random" or node.module != "numpy":
                    out[a.asname or a.name] = full
    return out


def _drawn_from(node, aliases: dict) -> str | None:
    """'random' / 'numpy.random' when the call draws from (or reseeds) that global generator."""
    if not isinstance(node, ast.Call):
        return None
    f = node.func
    if isinstance(f, ast.Name):
        full = aliases.get(f.id, "")
    elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        full = f"{aliases.get(f.value.id, '')}.{f.attr}"
    elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and isinstance(f.value.value, ast.Name) \
            and f.value.attr == "random" and aliases.get(f.value.value.id) == "numpy":
        full = f"numpy.random.{f.attr}"  # np.random.rand()
    else:
        return None
    gen, _, name = full.rpartition(".")
    return gen if gen in _WHO and name and name not in _NOT_DRAWS and not name.startswith("_") else None


def _sites(file: str, first: int | None, fn: str | None, which: set) -> list[tuple[int, str, str]]:
    """(line, function, generator) of the draws in the function `fn` starting at `first` (None: every function)."""
    t = lookup.tree(file)
    if t is None:
        return []
    aliases, out = _aliases(t), []
    for func in all_nodes(t):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or (fn is not None and (
                func.name != fn or min([func.lineno] + [d.lineno for d in func.decorator_list]) != first)):
            continue
        for node in ast.walk(func):
            gen = _drawn_from(node, aliases)
            if gen in which:
                out.append((node.lineno, func.name, gen, ast.unparse(node.func)))
    return out


def _called_files(codes) -> set[str]:
    """The files of the Python functions that `codes` call by a plain name, resolved in their modules' globals
    (`from lib import accept` in the target): a library function that ran no torch op is still found."""
    out = set()
    for code in codes:
        mod, t = loaded.module_in(code.co_filename, last=True), lookup.tree(code.co_filename)
        if mod is None or t is None:
            continue
        for node in all_nodes(t):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                fn = getattr(getattr(mod, node.func.id, None), "__code__", None)
                if fn is not None:
                    out.add(fn.co_filename)
    return out


@register("cpu-side-effect")
def global_generators_drawn(ctx):
    """`random.*()` / `np.random.*()` in the step: the host generator advances once, at capture."""
    changed = defaultdict(set)  # step -> the generators that advanced in it
    for s, changes in enumerate(ctx.trace.changes):
        changed[s] |= {c.attr for c in changes if c.owner == global_rng.OWNER}
    found: dict = {}  # (file, line) -> [count, function, generator, call text, caller]
    own = {ent[0].co_filename for ent in ctx.trace.codes.values() if ent[1] == OWN}
    for s, which in changed.items():
        if not which or s >= len(ctx.steps):
            continue
        codes = {code for r in ctx.steps[s] for code, _ in r.stack}
        hits = [(c.co_filename, *x) for c in codes for x in _sites(c.co_filename, c.co_firstlineno, c.co_name, which)]
        called = {}
        if not hits:  # drawn in a function that ran no torch op (a helper; a branch not taken): one called by name
            files = {c.co_filename for c in codes} | _called_files(codes)  # by one that ran, in its file or imported
            hits = [(f, *x) for f in files for x in _sites(f, None, None, which) if any(_calls(c, x[1]) for c in codes)]
        if not hits:  # or the `__call__` of a library object the target calls by syntax (`self.acc(d, t)`)
            called = called_objects.draws(ctx, own, codes, lambda f, first, fn: _sites(f, first, fn, which))
            hits = list(called)
        for file, line, fn, gen, text in hits:
            ent = found.setdefault((file, line), [0, fn, gen, text, None])
            ent[0] += 1
            if ent[4] is None:  # the target's line that led there; a draw in the target's own file is its own caller
                ent[4] = (file, line, fn) if file in own else called.get((file, line, fn, gen, text)) or \
                    caller_of(ctx, (file, line, fn), s) or called_by_name(ctx, (file, line, fn), s)
    return [ctx.finding("cpu-side-effect", (file, line, fn), f"{text}()", n / ctx.n_steps,
                        f"`{text}()` draws from {_WHO[gen]} generator inside the step: its state lives on the host, "
                        "so a replay draws nothing (the number drawn at capture is reused, the generator never "
                        "advances)", module=global_rng.OWNER, caller=caller,
                        fix="Draw on the device (torch.rand on the default generator, captured with the graph), or "
                            "draw on the host in prepare() and copy the value into a static device buffer.")
            for (file, line), (n, fn, gen, text, caller) in sorted(found.items())]
