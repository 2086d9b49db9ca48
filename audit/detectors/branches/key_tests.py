"""data-dependent-control: a test that gives the same answer for the same loop key in every step.

A loop over keys (`for name in self.active_adapters:`, `for i, a in enumerate(set(adapter_names)):`) that picks a
module per key (`lora_A = self.lora_A[name]`) may test the key against fixed things on the way: a sentinel
(`if a == "__base__": continue`), or an entry in a table the object keeps (`if name not in self.lora_variant:`,
`if name not in lora_keys: continue` with `lora_keys = self.lora_A.keys()`). Such a test answers the same for the
same key in every step, so it cannot be why two steps ran different modules or a different number of trips: the
keys the loop visited were (its iterable, or the pick by the key). A test that reads the key's own state
(`if p.enabled:`), a device value (`if hit[e]:`) or anything the step computes is not one of these; nor is a table
the same function changes (an LRU cache's `if k in self.lru:` in a loop that also runs `self.lru[k] = slot`,
`self.lru.move_to_end(k)` or `self.lru.popitem()`): its answer for a key depends on what earlier steps did.
"""

from __future__ import annotations

import ast

__all__ = ["fixed_key_test"]

_OPS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)


_MUTATORS = {"pop", "popitem", "move_to_end", "update", "setdefault", "clear", "add", "discard", "remove",
             "append", "appendleft", "extend", "insert", "__setitem__", "__delitem__"}


def _dump(n) -> str:
    return ast.dump(n, annotate_fields=False, include_attributes=False).replace("Store()", "Load()") \
        .replace("Del()", "Load()")


def _mutated(func, n) -> bool:
    """`func` changes the table `n` (`self.lru`) names: writes or deletes an item of it, calls one of its mutating
    methods, or rebinds it."""
    want = _dump(n)
    for x in ast.walk(func) if func is not None else ():
        if isinstance(x, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            for t in (x.targets if isinstance(x, (ast.Assign, ast.Delete)) else [x.target]):
                for e in ast.walk(t):
                    base = e.value if isinstance(e, ast.Subscript) else e
                    if isinstance(e, (ast.Subscript, ast.Attribute)) and _dump(base) == want:
                        return True
        if isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and x.func.attr in _MUTATORS \
                and _dump(x.func.value) == want:
            return True
    return False


def _self_chain(n, func=None) -> bool:
    """`self.x`, `self.x.y`, `self.x.keys()`: a table the object keeps (and `func` does not change)."""
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("keys", "values") \
            and not n.args:
        n = n.func.value
    if not isinstance(n, ast.Attribute):
        return False
    table, n = n, n
    while isinstance(n, ast.Attribute):
        n = n.value
    return isinstance(n, ast.Name) and n.id in ("self", "cls") and not _mutated(func, table)


def _literal(n) -> bool:
    if isinstance(n, ast.Constant):
        return True
    return isinstance(n, (ast.Tuple, ast.List, ast.Set)) and all(isinstance(e, ast.Constant) for e in n.elts)


def _bound_fixed(func, name: str) -> bool:
    """`name` is a local every assignment of which binds a literal or a table the object keeps."""
    values = []
    for n in ast.walk(func):
        if isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)) and \
                any(isinstance(t, ast.Name) and t.id == name for t in ast.walk(n.target)):
            return False
        if isinstance(n, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)) and isinstance(n.target, ast.Name) \
                and n.target.id == name:
            return False
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
            values.append(n.value)
    return bool(values) and all(_literal(v) or _self_chain(v, func) for v in values)


def _fixed(func, n) -> bool:
    return _literal(n) or _self_chain(n, func) or (isinstance(n, ast.Name) and _bound_fixed(func, n.id))


def _part(func, test, keys: set[str]) -> bool:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _part(func, test.operand, keys)
    if isinstance(test, ast.BoolOp):
        return all(_part(func, v, keys) for v in test.values)
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], _OPS)):
        return False
    left, right = test.left, test.comparators[0]
    key = lambda n: isinstance(n, ast.Name) and n.id in keys  # noqa: E731
    if isinstance(test.ops[0], (ast.In, ast.NotIn)):
        return key(left) and _fixed(func, right)
    return (key(left) and _fixed(func, right)) or (key(right) and _fixed(func, left))


def fixed_key_test(func, node) -> bool:
    """Whether `node` (an `if` inside `func`) only tests the key of a `for` loop of `func` holding it against a
    literal or a table the object keeps: the same answer for the same key in every step."""
    if func is None or not isinstance(node, ast.If):
        return False
    keys = {t.id for loop in ast.walk(func) if isinstance(loop, (ast.For, ast.AsyncFor))
            and loop.lineno < node.lineno <= (loop.end_lineno or loop.lineno)
            for t in ast.walk(loop.target) if isinstance(t, ast.Name)}
    return bool(keys) and _part(func, node.test, keys)
