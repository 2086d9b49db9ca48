"""counter_branches: a counter test compiled over its counter and the plain numbers and tables it reads.

`if self.pos % BS == 0:` becomes `_c % _a0 == 0`, with `_c` the counter and `_a0` the module's `BS`, so the test can
be run at the counter's values ahead (and at a loop variable's values, `_l_j`: `branches/loop_values.py`). Anything
it cannot read (a call, a tensor, an unknown name) leaves it uncompiled, and the caller falls back to the test's
shape.
"""

from __future__ import annotations

import ast
import numbers

from audit.detectors.source.number_tables import number_table
from audit.scan.snapshot.own_dict import own_dict
from audit.scan.sources.ast_nodes import attr_chain


def _number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def compiled(test, counter, refs, bound, selves, consts=None, names=None, loops=None):
    """(code, env) of the test over `_c` (the counter; `names`: a name for each counter it may read) and the
    plain numbers it reads (attributes of the object, and `consts`: the module's number constants the function
    does not shadow), with the tables of numbers a membership test looks in (`source/number_tables.py`: the
    object's, or frozensets in `consts`; a dict looked up with `.get(counter) is None` is read as `counter not in`
    its keys), and `loops`' variables as `_l_NAME`; else None."""
    env: dict = {}
    names = names or {counter: "_c"}

    def _table(e):  # a table of numbers a membership test looks in: the object's, or the module's
        if isinstance(e, ast.Name):
            return consts.get(e.id) if consts and isinstance(consts.get(e.id), frozenset) else None
        ch = attr_chain(e) if isinstance(e, ast.Attribute) else None
        v = selves[0] if ch and len(selves) == 1 else None
        for a in ch[1:] if v is not None else ():
            v = own_dict(v).get(a)
        return number_table(v) if v is not None else None

    def _looked_up(e):  # (table, key, absent) of `TABLE.get(key) is [not] None`, through locals it names
        if not (isinstance(e, ast.Compare) and len(e.ops) == 1 and isinstance(e.ops[0], (ast.Is, ast.IsNot))
                and isinstance(e.comparators[0], ast.Constant) and e.comparators[0].value is None):
            return None
        call, hops = e.left, 0
        while isinstance(call, ast.Name) and call.id in bound and hops < 4:
            call, hops = bound[call.id], hops + 1
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "get"
                and len(call.args) in (1, 2) and not call.keywords
                and (len(call.args) == 1 or isinstance(call.args[1], ast.Constant) and call.args[1].value is None)):
            return None
        return _table(call.func.value), call.args[0], isinstance(e.ops[0], ast.Is)

    def plain(e, depth=0):  # a copy of `e` over `_c` (the counter) and `_aN` (the numbers read), else None
        if id(e) in refs:
            return ast.Name(id=names[refs[id(e)]], ctx=ast.Load()) if refs[id(e)] in names else None
        if isinstance(e, ast.Name):
            if loops and e.id in loops:  # a loop's own variable (`for j in range(N)`): run at its values
                return ast.Name(id=f"_l_{e.id}", ctx=ast.Load())
            if e.id in bound:
                return plain(bound[e.id], depth + 1) if depth < 4 else None
            if consts and e.id in consts and _number(consts[e.id]):
                env[f"_a{len(env)}"] = consts[e.id]
                return ast.Name(id=f"_a{len(env) - 1}", ctx=ast.Load())
            return None
        if isinstance(e, ast.Attribute):
            ch = attr_chain(e)
            v = selves[0] if ch and len(selves) == 1 else None
            for a in ch[1:] if v is not None else ():
                v = own_dict(v).get(a)
            if not _number(v):
                return None
            env[f"_a{len(env)}"] = v
            return ast.Name(id=f"_a{len(env) - 1}", ctx=ast.Load())
        if isinstance(e, ast.Constant):
            return ast.Constant(e.value) if _number(e.value) or e.value is None or isinstance(e.value, bool) else None
        if isinstance(e, ast.BinOp):
            a, b = plain(e.left, depth), plain(e.right, depth)
            return None if a is None or b is None else ast.BinOp(a, e.op, b)
        if isinstance(e, ast.UnaryOp):
            a = plain(e.operand, depth)
            return None if a is None else ast.UnaryOp(e.op, a)
        if isinstance(e, ast.Compare) and len(e.ops) == 1 and isinstance(e.ops[0], (ast.In, ast.NotIn)):
            table, left = _table(e.comparators[0]), plain(e.left, depth)  # `self.pos in self.forced`
            if table is None or left is None:
                return None
            env[f"_a{len(env)}"] = table
            return ast.Compare(left, e.ops, [ast.Name(id=f"_a{len(env) - 1}", ctx=ast.Load())])
        if (got := _looked_up(e)) is not None:  # `self.forced.get(self.pos) is None`: `self.pos not in self.forced`
            table, key, absent = got
            left = plain(key, depth)
            if table is None or left is None:
                return None
            env[f"_a{len(env)}"] = table
            return ast.Compare(left, [ast.NotIn() if absent else ast.In()], [ast.Name(id=f"_a{len(env) - 1}",
                                                                                       ctx=ast.Load())])
        if isinstance(e, ast.Compare):
            parts = [plain(x, depth) for x in (e.left, *e.comparators)]
            return None if None in parts else ast.Compare(parts[0], e.ops, parts[1:])
        if isinstance(e, ast.BoolOp):
            parts = [plain(x, depth) for x in e.values]
            return None if None in parts else ast.BoolOp(e.op, parts)
        return None

    body = plain(test)
    return None if body is None else (compile(ast.fix_missing_locations(ast.Expression(body)), "<test>", "eval"), env)


def settled(expr, counter, refs, bound, selves, consts):
    """The number an expression that reads no counter comes to (a loop's `range` bound), else None."""
    found = compiled(expr, counter, refs, bound, selves, consts, names={})
    try:
        return eval(found[0], {"__builtins__": {}}, found[1]) if found else None
    except Exception:  # noqa: BLE001 - not a settled number
        return None



def grown(found, history) -> bool:
    """Whether a table of numbers the compiled test looks in holds every value the counter took in the audited
    steps and none ahead of the last: the step grows it with the counter (`if self.n not in self.built:
    self.built[self.n] = ...`), so it is no fixed table, and running the test forward on it says nothing."""
    for vals in ([b for b, _ in history], [a for _, a in history]):  # read before or after it moved
        up = vals[-1] >= vals[0]
        if any(isinstance(t, frozenset) and t and set(vals) <= t and
               (max(t) <= vals[-1] if up else min(t) >= vals[-1]) for t in found[1].values()):
            return True
    return False
