"""A descriptor's accessor, run by reading or writing the attribute it guards, as a state-change site.

A descriptor kept on a class (`scale = CountingAttr()`) runs its `__get__` on every `obj.scale` and its
`__set__` on every `obj.scale = v`, wherever that syntax is: in the target's code or in a library method
(`return self.head(x) * self.scale` in a policy's `forward`). No call names the accessor, and one that
only counts reads (`obj.__dict__["reads"] += 1`) runs no torch op, so neither the op stacks nor a search
for calls lead back to the target. The attribute names come from the classes of the object whose state
changed (the names under which an instance of the accessor's class is kept); the line that runs the
accessor is in a function on the step's op stacks that loads (or, for `__set__`, stores) one of those
names: the frame's own line when it has the syntax, else any line of its function (`s = self.scale` runs no op
itself); the target's innermost line on that stack is the caller. An accessor whose syntax no
function on the stacks writes did not run in the step: it is no site while another one is.
"""

from __future__ import annotations

import ast

from audit.detectors.source.mutations import tree
from audit.detectors.source.lookup import enclosing_function
from audit.detectors.state.sites import object_at
from audit.scan.sources.ast_nodes import all_nodes

_ACCESSORS = {"__get__": ast.Load, "__set__": ast.Store, "__delete__": ast.Del}


def _names(ctx, owner: str, site) -> list[str]:
    """The attribute names under which the classes of the object at `owner` keep a descriptor whose
    `site` function (`__get__`, ...) is written in the site's file."""
    file, _, fn = site
    obj = object_at(ctx, owner) if fn in _ACCESSORS and not owner.startswith("<") else None
    if obj is None:
        return []
    out = []
    for cls in type(obj).__mro__[:-1]:
        for name, val in list(vars(cls).items()):
            code = getattr(getattr(type(val), fn, None), "__code__", None)
            if code is not None and code.co_filename == file:
                out.append(name)
    return out


def _runs(code, line: int, names: list[str], want, whole: bool) -> bool:
    """Whether the statement of `code`'s file at `line` (`whole`: any line of the function holding it) reads
    (`want` ast.Load) or writes one of `names`."""
    t = tree(code.co_filename) if not whole else enclosing_function(code.co_filename, line)
    return t is not None and any(isinstance(n, ast.Attribute) and n.attr in names and isinstance(n.ctx, want)
                                 and (whole or n.lineno <= line <= (n.end_lineno or n.lineno)) for n in all_nodes(t))


def accessor_call(ctx, owner: str, site, step: int):
    """(file, line, function) of the target's innermost line on an op stack whose frames run the
    descriptor accessor of `site` by syntax (the target's own line when its own code has the syntax);
    None when the site is no descriptor accessor, or no stack shows the syntax."""
    names = _names(ctx, owner, site)
    if not names:
        return None
    want = _ACCESSORS[site[2]]
    for whole in (False, True):
        for r in ctx.steps[step]:
            for k, (code, line) in enumerate(r.stack):
                if not _runs(code, line, names, want, whole):
                    continue
                own = [f for f in r.stack[:k + 1] if ctx.trace.is_own(f[0])]
                if own:
                    return own[-1][0].co_filename, own[-1][1], own[-1][0].co_name
    return None


def ran_accessors(ctx, owner: str, sites: list, step: int) -> list:
    """Of `sites`, drop descriptor accessors whose syntax no op stack of the step shows while another
    accessor's does (a counting `__get__` ran; the `__set__` that stores under a computed key did not)."""
    ran = {s for s in sites if _names(ctx, owner, s) and accessor_call(ctx, owner, s, step) is not None}
    if not ran:
        return sites
    return [s for s in sites if s in ran or not _names(ctx, owner, s)]
