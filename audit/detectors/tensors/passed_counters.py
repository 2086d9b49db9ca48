"""A host position handed down through parameters: `start_pos + seqlen` is not a size read alone.

Reference decoders written for eager use (a generate loop calling `model.forward(tokens, start_pos)` with a
Python int) pass the position down `Transformer.forward` -> `layer(h, start_pos, ...)` -> the attention, which
cuts its caches with `self.cache_v[:bsz, :start_pos + seqlen]`, `seqlen` read off `x.size()`. Every such slice
varies with the position, and attending over the whole cache would leave each of them varying: each is an
origin of its own, not downstream of the first slice whose size it happens to equal. read_sizes excuses a
statement that reads a size unless it also reads a host counter; this follows a parameter the statement (or a
local it reads) uses outside its size reads out, frame by frame, through the argument each caller's call binds
to it, to an attribute the scan saw hold a changing plain number (prepare() setting `self.start_pos`), read
there or in a local that frame bound from it.
"""

from __future__ import annotations

import ast

from audit.detectors.source import call_args, lookup, scopes
from audit.detectors.tensors.size_reads import _attrs_read, _bound, _tensor_made, value_nodes


def _params(func) -> set:
    return scopes._params(func) if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()


def value_names(node) -> set:
    """Names the expression loads as values outside its size reads: `start_pos` in `start_pos + x.size(1)`, not
    `x`, nor a function called by name (`max`)."""
    return {n.id for n in value_nodes(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def passed_counter(frames, parts: list, counters: set) -> bool:
    """Whether a parameter that the innermost statement's expressions `parts` use outside size reads, directly or
    through a local its function bound earlier (`end_pos = start_pos + seqlen`), carries a host counter attribute
    from a caller further out. A local read only inside a size read (`self.v[:, :keys.size(1)]`) hands on no
    value. `frames` are (file, line), innermost first."""
    if not counters or len(frames) < 2:
        return False
    filename, line = frames[0]
    func = lookup.enclosing_function(filename, line)
    wanted = _with_locals(func, parts, line) & _params(func) - {"self"}
    for cfile, cline in frames[1:]:
        if not wanted:
            return False
        args = []
        for name in wanted:
            args += call_args.bound_args(cfile, cline, func, name) or []
        if not args:
            return False
        cfunc = lookup.enclosing_function(cfile, cline)
        exprs = args + [v for v in _bound(cfunc, set().union(*map(value_names, args)), cline) if not _tensor_made(v)]
        if any(_attrs_read(e) & counters for e in exprs):
            return True
        wanted = _with_locals(cfunc, args, cline) & _params(cfunc) - {"self"}
        func = cfunc
    return False


def _with_locals(func, exprs: list, line: int) -> set:
    """Names `exprs` read as values, and those read by the values `func` bound to them before `line` (a tensor
    a call made is an operand, not a number handed on)."""
    names = set().union(*map(value_names, exprs))
    bound = [v for v in _bound(func, names, line) if not _tensor_made(v)]
    return names | set().union(*map(value_names, bound))
