"""Host reads of a tensor the step itself copied to the host: the copy was the wait, the reads are host memory.

`ids = logits.argmax(-1).cpu()` is a host-sync at that line; what the code then does with `ids` (`for row in ids:
[int(t) for t in row if t != blank]`) reads host memory on a GPU and waits for nothing. On a CPU scan `.cpu()`
returns the tensor itself, so the storage alone cannot tell the copy from the device tensor it came from
(`x.cpu()` then `x.item()` is a second read of device memory): the source decides. A read is of the copy when
its line, in the function that made the copy, names the copy (the name it was assigned to, or a loop or
comprehension variable iterating it, or an alias of those) and its tensor is the copy's storage or was computed
from it alone in the step.
"""

from __future__ import annotations

import ast

from audit.detectors.host import sends
from audit.detectors.source import lookup
from audit.detectors.host.kept import host_derived

_MOVES = ("Tensor.cpu", "Tensor.to", "Tensor.numpy")


def _copy_names(filename: str, line: int):
    """(function node, names bound to the host copy made on `line` and to what iterates or aliases it)."""
    t = lookup.tree(filename)
    func = lookup.enclosing_function(filename, line) if t is not None else None
    if func is None or isinstance(func, ast.Module):
        return None, set()
    names = set()
    for n in ast.walk(func):
        if isinstance(n, ast.Assign) and n.lineno == line and sends._to_cpu(t, n.value):
            names |= {x.id for tgt in n.targets for x in ast.walk(tgt) if isinstance(x, ast.Name)}
    grew = bool(names)
    while grew:
        grew = False
        for n in ast.walk(func):
            if isinstance(n, (ast.For, ast.comprehension)):
                src, tgt = n.iter, n.target
            elif isinstance(n, ast.Assign) and isinstance(n.value, (ast.Name, ast.Subscript)):
                src, tgt = n.value, n.targets[0]
            else:
                continue
            if {x.id for x in ast.walk(src) if isinstance(x, ast.Name)} & names:
                new = {x.id for x in ast.walk(tgt) if isinstance(x, ast.Name)} - names
                names |= new
                grew |= bool(new)
    return func, names


def reads_of_copies(ctx) -> set:
    """ids of the host-read records (`bool`, `int`, `.item()`, `.tolist()` ...) of a host copy the step made."""
    out = set()
    for recs in ctx.steps:
        for i, c in enumerate(recs):
            if c.kind != "host" or c.op not in _MOVES or not c.stack or not c.inputs:
                continue
            file, line = c.stack[-1][0].co_filename, c.stack[-1][1]
            func, names = _copy_names(file, line)
            if not names:
                continue
            rest = recs[i + 1:]
            derived = host_derived(rest, {c.inputs[0].sid})
            for r in rest:
                if r.kind != "host" or not r.stack or not r.inputs or r.inputs[0].sid not in derived:
                    continue
                rf, rl = r.stack[-1][0].co_filename, r.stack[-1][1]
                if rf == file and func.lineno <= rl <= (func.end_lineno or rl) and _names_on(func, rl) & names:
                    out.add(id(r))
    return out


def _names_on(func, line: int) -> set:
    return {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and n.lineno == line}
