"""counter_branches: the values a loop around a counter test gives the other names the test reads.

`[bucket(self.pos - j) if j <= self.pos else 0 for j in range(MAX_LEN)]` tests the counter against the loop's
own variable: every audited step already ran the test at every `j`, so it took both sides in each step. Read
alone, `j` is unknown and the test looked like one the counter turns later. A loop over `range(...)` with
bounds the test's own reader can settle (constants, module numbers, the object's numbers) gives that name its
values, and the test is run over all of them.
"""

from __future__ import annotations

import ast
import itertools

_COMPS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_MAX = 4096  # combinations of loop values tried


def _generators(loop):
    if isinstance(loop, _COMPS):
        return loop.generators
    return [loop] if isinstance(loop, (ast.For, ast.AsyncFor)) else []


def loop_values(func, node, number) -> dict:
    """Name -> the ints a `for NAME in range(...)` (statement or comprehension) enclosing `node` in `func` gives it;
    `number(expr)` settles a bound to an int, else None (that loop is left out)."""
    out = {}
    for loop in ast.walk(func):
        gens = _generators(loop)
        if not gens or not any(n is node for st in _body(loop) for n in ast.walk(st)):
            continue
        for g in gens:
            it = g.iter
            if not (isinstance(g.target, ast.Name) and isinstance(it, ast.Call) and isinstance(it.func, ast.Name)
                    and it.func.id == "range" and not it.keywords and 1 <= len(it.args) <= 3):
                continue
            args = [number(a) for a in it.args]
            if all(isinstance(a, int) and not isinstance(a, bool) for a in args) and 0 < len(r := range(*args)) <= _MAX:
                out[g.target.id] = list(r)
    return out


def _body(loop):
    """What a loop's variable is bound over: a comprehension's element (and its filters), a `for`'s body."""
    if isinstance(loop, _COMPS):
        parts = [loop.key, loop.value] if isinstance(loop, ast.DictComp) else [loop.elt]
        return parts + [c for g in loop.generators for c in g.ifs]
    return loop.body


def combos(values: dict) -> list:
    """The loop values as `{_l_NAME: v}` dicts, every combination (capped)."""
    names = list(values)
    prod = itertools.islice(itertools.product(*(values[n] for n in names)), _MAX)
    return [{f"_l_{n}": v for n, v in zip(names, vs)} for vs in prod]
