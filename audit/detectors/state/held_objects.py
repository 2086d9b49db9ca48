"""Statements of a holder's methods that change a plain object it holds.

A dataclass of counters kept on a cache (`cache.info`) is advanced by the cache's method (`self.info.tokens +=
n` in `Cache.note`), not by a method of its own class. The state snapshot names the change by the held object
(`cache.info`, attribute `tokens`), and its class (`StepInfo`, a dataclass with no statement at all) offered
no line. The classes of the objects on the owner's path that hold it are searched too, for statements that
change the attribute through the holding name (`<x>.info.tokens`, also through a local bound from it). A held
object may sit in a container the holder keeps (a request table's `self.reqs[rid].decoded += 1`, the snapshot
naming it `table.reqs.0`): a container's member is reached through a subscript, whatever its key expression.
"""

from __future__ import annotations

import ast
import inspect

from audit.detectors.source import mutations
from audit.detectors.state.sites import object_at
from audit.scan.sources.ast_nodes import all_nodes


def holder_sites(ctx, change) -> list:
    """(file, line, function) of statements in the classes of the owner's holders (`cache` for `cache.info`)
    that change `change.attr` of the object they hold under its attribute name."""
    if change.owner.startswith("<") or "." not in change.owner:
        return []
    parts = change.owner.split(".")
    attr = change.attr.split(".")[-1]
    out = []
    for i in range(len(parts) - 1, 0, -1):
        holder = object_at(ctx, ".".join(parts[:i]))
        if holder is None:
            continue
        keys = _member_keys(holder, parts[i:])
        for file, span in _class_spans(type(holder)):
            out += [(file, line, fn) for line, fn in mutations.mutation_sites(file, attr, span)
                    if _through(file, line, parts[i:], attr, keys)]
        if out:
            break
    return out


def _class_spans(cls) -> list:
    """(file, (first, last)) of each class in `cls`'s MRO that has source."""
    out = []
    for c in cls.__mro__[:-1]:
        try:
            lines, start = inspect.getsourcelines(c)
            out.append((inspect.getsourcefile(c), (start, start + len(lines))))
        except (OSError, TypeError):
            continue
    return out


def _member_keys(holder, chain: list) -> set:
    """The positions in `chain` that name a member of a container (a dict key, a list index) rather than an
    attribute, found by walking from `holder` down the chain."""
    keys, obj = set(), holder
    for j, part in enumerate(chain):
        if isinstance(obj, dict):
            keys.add(j)
            obj = next((v for k, v in obj.items() if str(k) == part), None)
        elif isinstance(obj, (list, tuple)):
            keys.add(j)
            obj = obj[int(part)] if part.isdigit() and int(part) < len(obj) else None
        else:
            obj = getattr(obj, part, None)
    return keys


def _through(file: str, line: int, chain: list, attr: str, keys: set = frozenset()) -> bool:
    """Whether the statement on `line` reaches `attr` through the holding names (`self.info.tokens`; `chain`
    ["meta", "stats"] for `self.meta.stats.tokens`; a position in `keys` is a container member, reached by a
    subscript: `self.reqs[rid].decoded`), or through a local the function bound from the last of them
    (`info = self.info; info.tokens += 1`, `req = self.reqs[rid]; req.decoded += 1`), or through a local bound
    from the attribute itself (`samples = task._progress; samples.append(s)`, rich's `Progress.update`)."""
    held = chain[-1]
    t = mutations.tree(file)
    if t is None:
        return False
    func = next((f for f in all_nodes(t) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and f.lineno <= line <= (f.end_lineno or f.lineno)), None)
    if func is None:
        return False
    local = {x.id for n in ast.walk(func) if isinstance(n, ast.Assign) and (
        (isinstance(n.value, ast.Attribute) and n.value.attr == held) or (keys and _names_chain(n.value, chain, keys)))
        for x in n.targets if isinstance(x, ast.Name)}
    def held_attr(n) -> bool:
        return isinstance(n, ast.Attribute) and n.attr == attr and (
            (isinstance(n.value, ast.Name) and n.value.id in local) or _names_chain(n.value, chain, keys))

    bound = {x.id for n in ast.walk(func) if isinstance(n, ast.Assign) and held_attr(n.value)  # `q = task._progress`
             for x in n.targets if isinstance(x, ast.Name)}
    for n in ast.walk(func):
        if getattr(n, "lineno", 0) == line and (held_attr(n) or (isinstance(n, ast.Name) and n.id in bound)):
            return True
    return False


def _names_chain(v, chain: list, keys: set = frozenset()) -> bool:
    """`<x>.meta.stats` for chain ["meta", "stats"]; `<x>.reqs[<any>]` for ["reqs", "0"] with position 1 a key."""
    for j in range(len(chain) - 1, -1, -1):
        if j in keys:
            if not isinstance(v, ast.Subscript):
                return False
        elif not (isinstance(v, ast.Attribute) and v.attr == chain[j]):
            return False
        v = v.value
    return True
