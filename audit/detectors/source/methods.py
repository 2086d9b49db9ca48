"""Whether a method called on a changed object could have changed the attribute at all, from its source.

A library's holder reaches into an object it keeps (rich's `Progress.update`: `task = self._tasks[i]`, then
`task._reset()` on one branch and `task.completed += advance` on another). The calls on the object are
candidate sites of a change found in it, but a method of the object's own class whose body never writes the
changed attribute, and calls no other method of its class that might, cannot have changed it: `task._reset()`
clears the samples, not `completed`. Such a call is no site of that change.
"""

from __future__ import annotations

import ast
import inspect

from audit.detectors.source import mutations


def _method_def(cls, name: str):
    """(file, FunctionDef) of `name` as the class defines it in Python, else None."""
    fn = inspect.getattr_static(cls, name, None)
    fn = getattr(fn, "__func__", fn)
    if not inspect.isfunction(fn):
        return None
    try:
        file, (lines, start) = inspect.getsourcefile(fn), inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    return (file, (start, start + len(lines))) if file else None


def writes_nothing(obj, method: str, attr: str) -> bool:
    """Whether `obj.method()` cannot change `obj.attr`: a Python method of its class that writes no `attr` and
    calls no other method of that class (a property or an attribute of that name is never ruled out)."""
    if obj is None or not isinstance(inspect.getattr_static(type(obj), method, None), type(lambda: 0)):
        return False
    found = _method_def(type(obj), method)
    if found is None:
        return False
    file, span = found
    if mutations.mutation_sites(file, attr, span):
        return False
    t = mutations.tree(file)
    for n in ast.walk(t) if t is not None else ():
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and span[0] <= n.lineno <= span[1] \
                and isinstance(n.func.value, ast.Name) and n.func.value.id == "self" \
                and callable(inspect.getattr_static(type(obj), n.func.attr, None)):
            return False
    return True
