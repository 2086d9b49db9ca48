"""A skipped loop's index handed to a helper: the helper's use of it is the skip's finding.

`for e in range(E): if idx.numel() == 0: continue; y = self.experts.forward_one(e, x)`, with
`forward_one` reading `self.w1[e]`: the k-th run of the helper's line is another expert in another
step only because the loop skipped a different one. The baked value at the helper's line is the
loop guard's doing (data-dependent-control names it), just as `w[e]` written in the loop itself is.
We follow the value from the innermost frame out: the line reads a parameter of its function, and
the caller's call of that function passes an argument that reads a name, one frame out, until a
frame's line reads the index of a loop with a skip (`lookup.skipped_loop_index`).
"""

from __future__ import annotations

import ast

from audit.detectors.source import call_args, lookup, scopes


def _names(node) -> set:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _read_at(func, line: int) -> set:
    """Names read on `line` inside `func` (not the ones assigned there)."""
    return {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and n.lineno == line
            and isinstance(n.ctx, ast.Load)}


def _own_params(func) -> set:
    return scopes._params(func) if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()


def _passed(caller_file: str, caller_line: int, callee, name: str) -> set | None:
    """Names the caller's call(s) of `callee` on `caller_line` read in the argument bound to `name`;
    None when no call there can be matched to `callee`."""
    args = call_args.bound_args(caller_file, caller_line, callee, name)
    return None if args is None else set().union(*(_names(a) for a in args))


def passed_skipped_index(stack) -> bool:
    """Whether the innermost frame's value comes, through parameters, from the index of a loop that a
    data-dependent conditional skips in some frame further out (see the module docstring)."""
    if len(stack) < 2:
        return False
    code, line = stack[-1]
    func = lookup.enclosing_function(code.co_filename, line)
    wanted = _read_at(func, line) & _own_params(func) if func is not None else set()
    for k in range(len(stack) - 2, -1, -1):
        if not wanted:
            return False
        ccode, cline = stack[k]
        passed = set()
        for name in wanted:
            passed |= _passed(ccode.co_filename, cline, func, name) or set()
        if not passed:
            return False
        if lookup.skipped_loop_index(ccode.co_filename, cline) and _loop_index_in(ccode.co_filename, cline, passed):
            return True
        func = lookup.enclosing_function(ccode.co_filename, cline)
        wanted = passed & _own_params(func)  # only a parameter carries the value one frame further out
    return False


def _loop_index_in(filename: str, line: int, names: set) -> bool:
    """Whether one of `names` is the index of the innermost loop holding `line`."""
    func = lookup.enclosing_function(filename, line)
    loop = lookup._loop_of(func, line) if func is not None and not isinstance(func, ast.Module) else None
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    return bool(_names(loop.target) & names)
