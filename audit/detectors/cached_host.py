"""pageable-copy, CPU scans: a host tensor a cached helper returns, moved to the device in the step.

`@functools.lru_cache def host_filters(n): return torch.from_numpy(mel(n))`, then `host_filters(n).to(x.device)`
in forward: the helper ran once, before the step (in warmup), so no op of the step made the tensor and the rules
that follow host data through the step (host_data.py) never learn it lives in host memory; on a GPU every call
copies it from pageable memory, which capture refuses. On a CPU scan `.to(D)` copies nothing, so the source
decides: the receiver of the `.to(D)` on the line is a call of a function of the same file (or a method of the
enclosing class, through `self`), or a local assigned only from such calls, and every `return` of that function
is a tensor made in host memory (a torch factory naming no device or the CPU, `torch.from_numpy`,
`torch.tensor(data)`, or `.cpu()` / `.to("cpu")`). A helper that moves its result itself (Whisper's
`mel_filters(device, n)` returning `...to(device)`) is no host tensor; one made in the step is host_data's.
"""

from __future__ import annotations

import ast

from audit.detectors import register
from audit.detectors.host import sends
from audit.detectors.source import lookup, mutations
from audit.detectors.source.scopes import own_nodes
from audit.scan.sources.ast_nodes import all_nodes, calls_at

MSG = ("the host tensor returned by `{fn}` (made in host memory, and by a call that ran before the step: a "
       "cached helper) is moved to the device in the step: on a GPU that is a copy from pageable host memory, "
       "and capture raises 'Cannot copy between CPU and CUDA tensors ...'")
FIX = ("Cache the tensor on the device (move it inside the cached helper, keyed by device, or register it as a "
       "buffer) so the step reads a device tensor made once.")


def _host_made(filename: str, t, value) -> bool:
    return mutations._host_factory(filename, value) or mutations._host_computed(filename, value) \
        or sends._to_cpu(t, value)


def _helper(t, filename: str, call, line: int):
    """The FunctionDef a call names: a module-level function of the file, or `self.<method>` of the class
    enclosing `line`."""
    f = call.func
    if isinstance(f, ast.Name):
        return next((n for n in t.body if isinstance(n, ast.FunctionDef) and n.name == f.id), None)
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
        cls = next((n for n in all_nodes(t) if isinstance(n, ast.ClassDef) and n.lineno <= line <= n.end_lineno), None)
        return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == f.attr), None) if cls else None
    return None


def _returns_host(t, filename: str, call, line: int) -> str | None:
    fn = _helper(t, filename, call, line) if isinstance(call, ast.Call) else None
    # its own returns: a nested helper's (`def slopes(n): return [...]` building the list it wraps) are not its result
    rets = [r.value for r in own_nodes(fn) if isinstance(r, ast.Return)] if fn is not None else []
    if rets and all(v is not None and _host_made(filename, t, v) for v in rets):
        return fn.name
    return None


def host_helper_moved(filename: str, line: int) -> str | None:
    """The name of the helper whose host tensor a `.to(...)` call on `line` moves, or None."""
    t = lookup.tree(filename)
    func = lookup.enclosing_function(filename, line) if t is not None else None
    for n in calls_at(t, line) if t is not None else ():
        if not (isinstance(n.func, ast.Attribute) and n.func.attr == "to"):
            continue
        recv = n.func.value
        if isinstance(recv, ast.Name) and func is not None and not isinstance(func, ast.Module):
            values = [a.value for a in ast.walk(func) if isinstance(a, ast.Assign)
                      and any(isinstance(x, ast.Name) and x.id == recv.id for x in a.targets)]
            names = {_returns_host(t, filename, v, line) for v in values}
            if values and None not in names:
                return names.pop()
        elif (name := _returns_host(t, filename, recv, line)):
            return name
    return None


@register("pageable-copy")
def cached_host_to_device(ctx):
    """CPU scans: `helper(...).to(D)`, D not the CPU, of a host tensor the helper made before the step (cached)."""
    if ctx.cuda:
        return []
    hits, names = [], {}
    for recs in ctx.steps:
        made = set()  # storages ops of the step produced so far (a later view of the moved tensor shares its storage)
        for r in recs:
            if r.kind == "aten":
                made.update(m.sid for m in r.outputs)
            if r.kind != "host" or r.note != "cpu?" or not r.stack or not r.inputs or r.inputs[0].sid in made:
                continue
            code, line = r.stack[-1]
            if not lookup.names_cpu(code.co_filename, line) and (fn := host_helper_moved(code.co_filename, line)):
                hits.append(r)
                names[id(r)] = fn
    return [ctx.finding("pageable-copy", g[0], op, len(g) / ctx.n_steps, MSG.format(fn=names[id(g[0])]), fix=FIX,
                        severity="blocks-capture")
            for (_, _, op, _), g in ctx.per_site(hits).items()]
