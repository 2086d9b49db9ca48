"""A statement that stores back what a library call returned for the object it was handed.

`self.kw = self.model.update_model_kwargs(self.kw, tokens)` (transformers' `model_kwargs =
self._update_model_kwargs_for_generation(outputs, model_kwargs)`) hands the dict to the library, which changes
it under its own name (`model_kwargs["cur_len"] += 1`) and returns it. The store is a statement that assigns
the attribute, so a search for the change's statements finds it, yet the change was made in the library: the
store only puts the same object back. Such sites give way to the library's statements
(`handoff.handed_over`) when there are any.
"""

from __future__ import annotations

import ast

from audit.detectors.source.lookup import tree
from audit.scan.sources.ast_nodes import all_nodes


def _is_attr(n, attr: str) -> bool:
    return isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.value, ast.Name)


def _stores_back(file: str, line: int, attr: str) -> bool:
    """The statement on `line` is `<x>.attr = <call>(..., <x>.attr, ...)`: the call is handed the object."""
    t = tree(file)
    for n in all_nodes(t) if t is not None else ():
        if isinstance(n, ast.Assign) and n.lineno <= line <= (n.end_lineno or n.lineno) \
                and any(_is_attr(x, attr) for x in n.targets) and isinstance(n.value, ast.Call):
            args = list(n.value.args) + [k.value for k in n.value.keywords]
            return any(_is_attr(a, attr) for a in args)
    return False


def handed_back_only(sites, attr: str) -> bool:
    """No site, or every one only stores back the object a library call was handed (`attr`: the change's
    attribute, `kw` of `kw['cur_len']`)."""
    head = attr.split(".")[0].split("[")[0]
    return all(_stores_back(f, line, head) for f, line, _ in sites)
