"""Statements the sampling loop runs between steps, told apart from the ones the step runs.

A Python state change that went through no `__setattr__` hook and ran no torch op is placed by reading source:
every statement that writes the attribute is a candidate. A method the loop calls between steps through the
target's `prepare()` (a scheduler's `set_step(i)`, which sets the same `_step_index` the step's own `_advance()`
moves on) writes the same attribute as the code the step runs, and naming both puts one finding on a line the
step never ran. When some candidates sit in functions the code the step ran reaches by name (calls, attribute
reads for properties, followed through the candidates' files; dunders count as reached), the others are dropped;
when none does, all are kept. The same reading serves two more site questions: which library functions that ran
no torch op the step reached (`reached_spans`: a callback object's `__call__`), and whether a statement under
`if self.x is None:` could have run in a step that began with `x` set (`lazy_init_line`). A candidate that stores a
literal the attribute did not end with (a flush's `self.rows = []` when the list grew by one) is dropped too (`fitting`).
"""

from __future__ import annotations

import ast

from audit.detectors.source import lookup
from audit.detectors.source.name_reach import defs_by_name, names_used, reached_from, reached_names
from audit.detectors.source.lookup import tree
from audit.scan.sources.ast_nodes import all_nodes
from audit.scan.snapshot.fingerprint import fp as fingerprint
from audit.scan.sources.user_code import LIBRARY, frame_kind

_SETUP = ("prepare", "__init__")
_SIZED = ("list", "deque", "dict", "set", "frozenset")  # fingerprints (kind, size, members)


def step_sites(ctx, step: int, sites: list, change=None) -> list:
    """`sites` ((file, line, function) candidates) less those the step's code never names, and less those
    that store a literal the change did not end with (`self.metrics = []` in a flush the step reaches only
    by name, when the list grew from 2 to 3 items)."""
    sites = fitting(sites, change) if change is not None else sites
    if len(sites) < 2:
        return sites
    in_step = step_names(ctx, step, {f for f, _, _ in sites})
    kept = [s for s in sites if s[2] in in_step or s[2].startswith("__")]
    return kept or sites


def step_names(ctx, step: int, files: set) -> set:
    """Names of the functions the code the step ran reaches by name, followed through its files and `files`."""
    return reached_from({code for r in ctx.steps[step] for code, _ in r.stack}, files, skip=_SETUP)


def fitting(sites: list, change) -> list:
    """`sites` less those that store a literal the change did not end with (all of them if none is left)."""
    return [s for s in sites if not _stores_other_literal(s, change.after)] or sites


def empties(file: str, line: int, fn: str, change) -> bool:
    """Whether the candidate at `line` (in `fn`) stores a literal or empties a container the change did not end with."""
    return _stores_other_literal((file, line, fn), change.after)


def _stores_other_literal(site, after) -> bool:
    """The statement at `site` assigns a literal (`[]`, `0`, `None`, `{}`) whose fingerprint is not `after`, or
    empties a container (`self._progress.clear()`) that ended with members."""
    t = tree(site[0])
    for n in all_nodes(t) if t is not None else ():
        if isinstance(n, ast.Expr) and n.lineno == site[1] and isinstance(n.value, ast.Call) \
                and isinstance(n.value.func, ast.Attribute) and n.value.func.attr == "clear" and not n.value.args:
            return isinstance(after, tuple) and len(after) == 3 and after[0] in _SIZED and (after[1] or 0) > 0
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.lineno == site[1] and n.value is not None:
            try:
                value = ast.literal_eval(n.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return False
            return fingerprint(value) != after
    return False


def reached_spans(ctx, step: int) -> list:
    """(file, span, False) of the functions of installed library files on the step's stacks that ran no torch op
    but that the functions which did reach by name, a dunder included (a `callback_on_step_end` object's
    `__call__` setting `pipe._guidance_scale = 0.0`, called as `callback(pipe, i, t, kw)`): where a change
    handed to library code is looked for once the functions that ran ops hold no statement for it."""
    codes = {code for r in ctx.steps[step] for code, _ in r.stack}
    files = {c.co_filename for c in codes
             if not ctx.trace.is_own(c) and frame_kind(c.co_filename, ctx.trace.roots) == LIBRARY}
    defs: dict = {}
    for f in sorted(files):
        for k, v in defs_by_name(f).items():
            defs.setdefault(k, []).extend((f, d) for d in v)
    ran = {(c.co_filename, c.co_firstlineno) for c in codes}
    start = set().union(*(names_used(d) for c in codes for f, d in defs.get(c.co_name, ())
                          if f == c.co_filename and lookup.def_first_line(d) <= c.co_firstlineno <= d.body[0].lineno))
    names = reached_names(start, {k: [d for _, d in v] for k, v in defs.items()})
    out = [(f, (d.lineno, d.end_lineno), False) for k, v in sorted(defs.items()) for f, d in v
           if (k in names or k.startswith("__") and k != "__init__") and (f, lookup.def_first_line(d)) not in ran]
    return sorted(set(out))


def lazy_init_line(change, site) -> bool:
    """A site under `if <x>.attr is None:` (or `if <x>.attr is None or ...`: a lazy first-call setup such as
    `self.noise_iter = iter(...)`) when the attribute held a value before the step: that block did not run in
    it, so the change (the iterator advanced by `next(self.noise_iter)`) is another line's."""
    if change.before is None or "." in change.attr:
        return False
    t = tree(site[0])
    for n in all_nodes(t) if t is not None else ():
        if isinstance(n, ast.If) and n.body[0].lineno <= site[1] <= n.body[-1].end_lineno \
                and _is_none_test(n.test, change.attr):
            return True
    return False


def _is_none_test(test, attr: str) -> bool:
    tests = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) else [test]
    return any(isinstance(x, ast.Compare) and len(x.ops) == 1 and isinstance(x.ops[0], ast.Is)
               and isinstance(x.left, ast.Attribute) and x.left.attr == attr
               and isinstance(x.comparators[0], ast.Constant) and x.comparators[0].value is None for x in tests)
