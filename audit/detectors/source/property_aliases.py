"""A property that only hands back another attribute of its object, read as that attribute.

diffusers' schedulers keep their position in `self._step_index` and read it everywhere through
`@property def step_index(self): return self._step_index`. A rule that follows a plain attribute the step
changed (a counter a branch tests) sees the read `self.step_index` and the change of `_step_index`: the
getter's single `return self.<name>` says they are one value. A getter that computes anything is not one.
"""

from __future__ import annotations

import ast

from audit.scan.sources.frame_source import function_of


def returned_attr(obj, name: str) -> str | None:
    """The attribute `obj`'s class property `name` returns as it is (`return self._step_index`), else None."""
    prop = next((vars(c)[name] for c in type(obj).__mro__ if name in vars(c)), None) if obj is not None else None
    code = getattr(getattr(prop, "fget", None), "__code__", None) if isinstance(prop, property) else None
    func = function_of(code) if code is not None and code.co_argcount == 1 else None
    body = [st for st in func.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))] \
        if func is not None else []
    if len(body) != 1 or not isinstance(body[0], ast.Return):
        return None
    v = body[0].value
    me = func.args.args[0].arg
    ok = isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == me and v.attr != name
    return v.attr if ok else None


def returned_attr_at(ctx, path: str, name: str) -> str | None:
    """returned_attr for the traced object at `path` (the paths looked up once per scan, each class's property
    read once)."""
    objs = ctx.__dict__.get("_objects_by_path")
    if objs is None:
        objs = ctx.__dict__["_objects_by_path"] = {}
        for p, obj in ctx.trace.objects:
            objs.setdefault(p, obj)
    obj = objs.get(path)
    known = ctx.__dict__.setdefault("_returned_attrs", {})
    key = (type(obj), name)
    if key not in known:
        known[key] = returned_attr(obj, name)
    return known[key]
