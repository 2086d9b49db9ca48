"""What the data-dependent-control rule asks the source about one line: whether an `if` only tests a plain flag
or an optional value's presence, whether a call evaluates ops among its arguments first, whether a line is a
comprehension. Pure readers of the parsed file; the rule in control.py decides what they mean."""

from __future__ import annotations

import ast

from audit.detectors.device import flag_reach
from audit.detectors.source import lookup
from audit.scan.sources.ast_nodes import all_nodes

__all__ = ["args_first", "comprehension_at", "held", "presence_test"]


def held(filename: str, line: int, flags: dict) -> bool:
    """The `if` on `line` tests a plain flag the scan read with one value in every step (`if self.on:`): it
    decided nothing."""
    t = lookup.tree(filename)
    tests = [n.test for n in all_nodes(t) if isinstance(n, ast.If) and n.lineno == line] if t is not None else []
    return bool(tests) and flag_reach.seen(filename, line, flags, tests[0]) is not None


def presence_test(filename: str, line: int) -> bool:
    """The `if` on `line` only tests whether an optional value was given (`if procs is not None:`): configuration
    a decode step keeps, so when the call in its body goes on into a function with a branch of its own before its
    ops (a min-length processor's `if self.cur_len < self.min_length:`), that branch decided."""
    t = lookup.tree(filename)
    tests = [n.test for n in all_nodes(t) if isinstance(n, ast.If) and n.lineno == line] if t is not None else []
    parts = (tests[0].values if isinstance(tests[0], ast.BoolOp) else [tests[0]]) if tests else []
    return bool(parts) and all(
        isinstance(c, ast.Compare) and len(c.ops) == 1 and isinstance(c.ops[0], (ast.Is, ast.IsNot))
        and isinstance(c.comparators[0], ast.Constant) and c.comparators[0].value is None for c in parts)


_ISSUES_OPS = (ast.Call, ast.Subscript, ast.BinOp, ast.UnaryOp, ast.Compare)  # argument expressions that may run ops


def args_first(filename: str, line: int, callee: str) -> bool:
    """Whether `line` calls `callee` with an op among its arguments (`layer.cross(layer.ln2(x), audio)`, a row
    sliced out for a per-request processor list, `procs(ids[b:b + 1], logits[b:b + 1])`, whose `__call__` is
    `callee`): the op that ran at the line just before may be the argument's, evaluated first, so entering
    `callee` next is the same statement going on, not another iteration of the loop around it."""
    t = lookup.tree(filename)
    return t is not None and any(
        isinstance(n, ast.Call) and n.lineno <= line <= (n.end_lineno or n.lineno)
        and ((n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)) == callee
             or (callee in ("__call__", "forward") and isinstance(n.func, (ast.Name, ast.Attribute))))
        and any(isinstance(a, _ISSUES_OPS) for arg in n.args + [k.value for k in n.keywords] for a in ast.walk(arg))
        for n in all_nodes(t))


_COMPS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def comprehension_at(filename: str, line: int) -> bool:
    """Whether a comprehension or generator expression spans `line` (its own frame, or inlined in 3.12+)."""
    t = lookup.tree(filename)
    return t is not None and any(isinstance(n, _COMPS) and n.lineno <= line <= (n.end_lineno or n.lineno)
                                 for n in all_nodes(t))
