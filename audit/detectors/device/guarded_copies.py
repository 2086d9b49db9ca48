"""Host reads of a tensor that a device branch the CPU scan skipped copies to the host first.

`if x.device != torch.device("cpu"): x = x.cpu()` and then `np.array(x)` (Keras's `convert_to_numpy`, and the
common `if t.is_cuda: t = t.cpu()` before `t.numpy()` / `t.tolist()`): on a GPU the branch runs, its `.cpu()` is
the one wait (guarded_sync reports it, found in the source), and the read after the branch is of host memory.
A CPU scan skips the branch, so it traces the read on the device-less tensor and would report the same wait a
second time, at a line that on a GPU waits for nothing. A read is the copy's when its line, in the function
holding the branch and after it, names the variable the GPU side rebinds to the copy, with no other assignment
of that name between the branch and the read.
"""

from __future__ import annotations

import ast

from audit.detectors.host import sends
from audit.detectors.source import lookup, scopes
from audit.detectors.device.cuda_side import cuda_side
from audit.detectors.device.device_branches import guards

_READS = ("Tensor.numpy", "Tensor.tolist", "Tensor.item", "Tensor.__bool__", "Tensor.__int__", "Tensor.__float__",
          "Tensor.__index__", "Tensor.cpu", "Tensor.to")


def _gpu_side(tree, node: ast.If, ran) -> list:
    """The statements of the side of `node` a GPU takes: the one its test settles (`x.is_cuda`), or, for
    another device test, the side that ran nothing on this CPU scan."""
    side = cuda_side(node.test, lambda e: scopes.values(tree, e, node.lineno))
    if side is not None:
        return node.body if side == "body" else node.orelse
    if not scopes.device_test(tree, node.test):
        return []
    sides = [b for b in (node.body, node.orelse) if b and not ran(b)]
    return sides[0] if len(sides) == 1 else []


def _copied_names(tree, func, ran) -> list:
    """(name, last line of the branch) for each `name = name.cpu()` (or `.to(<the CPU>)`) on a GPU side that
    ran nothing in this scan."""
    out = []
    for node in guards(func):
        if getattr(node, "expr", False):
            continue
        body = _gpu_side(tree, node, ran)
        if not body or ran(body):
            continue
        for st in body:
            for n in ast.walk(st):
                if isinstance(n, ast.Assign) and sends._to_cpu(tree, n.value):
                    end = max(s.end_lineno or s.lineno for s in body)
                    out += [(t.id, end) for t in n.targets if isinstance(t, ast.Name)]
    return out


def _rebound(func, name: str, after: int, before: int) -> bool:
    """Whether `name` is assigned on a line strictly between `after` and `before`."""
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
               and after < n.lineno < before for n in ast.walk(func))


def reads_after_guarded_copies(ctx) -> set:
    """(CPU scans) ids of the host-read records whose tensor a skipped GPU-side branch copied to the host."""
    if ctx.cuda:
        return set()
    lines = {(code.co_filename, line) for recs in ctx.steps for r in recs for code, line in r.stack}
    out, cache = set(), {}
    for recs in ctx.steps:
        for r in recs:
            if r.kind != "host" or r.op not in _READS or not r.stack:
                continue
            file, line = r.stack[-1][0].co_filename, r.stack[-1][1]
            key = (file, r.stack[-1][0].co_firstlineno)
            if key not in cache:
                cache[key] = _names_for(file, line, lines)
            func, copied = cache[key]
            if func is None:
                continue
            named = {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and n.lineno == line}
            if any(name in named and end < line and not _rebound(func, name, end, line) for name, end in copied):
                out.add(id(r))
    return out


def _names_for(file: str, line: int, lines: set):
    tree = lookup.tree(file)
    func = lookup.enclosing_function(file, line) if tree is not None else None
    if func is None or isinstance(func, ast.Module):
        return None, []

    def ran(body) -> bool:
        return any((file, n) in lines for st in body for n in range(st.lineno, (st.end_lineno or st.lineno) + 1))

    return func, _copied_names(tree, func, ran)
