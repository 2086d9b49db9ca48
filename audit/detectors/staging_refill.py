"""cpu-side-effect: a pinned staging buffer refilled through a numpy view inside the step.

`self.cpu.numpy()[:n] = lens` (or `np.copyto(self.cpu.numpy(), a)`, or a view taken once and written)
writes host memory with no torch op. Inside a graph it runs once, at capture; every replay then uploads the
bytes of the captured step. audit.scan.snapshot.staging_bytes hashes the buffers around each step; a buffer whose
bytes changed with no in-place torch op on it (those are host_tensors_changed_in_place's) is reported at the
statement that writes through its view, read from the functions that ran, with the target's line as caller.
"""

from __future__ import annotations

import ast

from audit.detectors import register
from audit.detectors.source import lookup
from audit.detectors.host import staging_params
from audit.detectors.host.kept import cpu_attrs, in_place_updates
from audit.detectors.state.sites import caller_of
from audit.scan.sources.ast_nodes import all_nodes
from audit.scan.snapshot import staging_bytes

_VIEWS = ("numpy", "asarray", "frombuffer")


def _view_of(expr, attr: str, aliases: set, bare: bool = False) -> bool:
    """Is `expr` a numpy view of `<x>.attr` (`x.attr.numpy()`, `np.asarray(x.attr)`; bare: of the name `attr`, a
    parameter the buffer was handed in), a slice of one, or an alias?"""
    while isinstance(expr, ast.Subscript):
        expr = expr.value
    if isinstance(expr, ast.Name):
        return expr.id in aliases
    if not (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _VIEWS):
        return False
    base = expr.func.value if expr.func.attr == "numpy" else (expr.args[0] if expr.args else None)
    while isinstance(base, ast.Subscript):
        base = base.value
    return (isinstance(base, ast.Attribute) and base.attr == attr) or (bare and isinstance(base, ast.Name)
                                                                       and base.id == attr)


def _writes(func, attr: str, bare: bool = False) -> list[int]:
    """Lines of `func` that write through a numpy view of `<x>.attr` (bare: of the name `attr`)."""
    aliases, out = set(), []
    for node in sorted((n for n in ast.walk(func) if isinstance(n, ast.stmt)), key=lambda n: n.lineno):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and _view_of(node.value, attr, aliases, bare):
            aliases.add(node.targets[0].id)  # `v = self.cpu.numpy()`
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        if any(isinstance(t, ast.Subscript) and _view_of(t, attr, aliases, bare) for t in targets):
            out.append(node.lineno)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            call = node.value
            name = getattr(call.func, "attr", getattr(call.func, "id", None))
            if (name == "copyto" and call.args and _view_of(call.args[0], attr, aliases, bare)) or (
                    name in ("fill", "put", "sort") and isinstance(call.func, ast.Attribute)
                    and _view_of(call.func.value, attr, aliases, bare)):
                out.append(node.lineno)
    return out


@register("cpu-side-effect")
def staging_refilled_through_numpy(ctx):
    """A pinned staging buffer whose bytes the step changed without a torch op: refilled through numpy."""
    sids = {label: sid for sid, label, *_ in cpu_attrs(ctx)}
    found: dict = {}  # (file, line) -> [steps, function, label, caller]
    for s, changes in enumerate(ctx.trace.changes):
        labels = [c.attr for c in changes if c.owner == staging_bytes.OWNER]
        if not labels or s >= len(ctx.steps):
            continue
        written = {r.inputs[0].sid for r in in_place_updates(ctx, {sid: "" for sid in sids.values()}) if r.step == s}
        codes = {code for r in ctx.steps[s] for code, _ in r.stack}
        for label in labels:
            if sids.get(label) in written:
                continue  # a torch op wrote it: host_tensors_changed_in_place reports that
            for code in codes:
                t = lookup.tree(code.co_filename)
                func = next((n for n in all_nodes(t) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                             and n.name == code.co_name and min([n.lineno] + [d.lineno for d in n.decorator_list])
                             == code.co_firstlineno), None) if t is not None else None
                for line in _writes(func, label.split(".")[-1]) if func is not None else ():
                    site = (code.co_filename, line, code.co_name)
                    ent = found.setdefault(site[:2], [0, code.co_name, label, None])
                    ent[0] += 1
                    ent[3] = ent[3] or caller_of(ctx, site, s)
            if not any(ent[2] == label for ent in found.values()):  # handed to a helper that fills it (host/staging_params.py)
                for file, line, fn, caller in staging_params.handed_writes(ctx, codes, label.split(".")[-1], _writes):
                    ent = found.setdefault((file, line), [0, fn, label, caller])
                    ent[0] += 1
    return [ctx.finding("cpu-side-effect", (file, line, fn), "numpy write", n / ctx.n_steps,
                        f"the step refills the pinned staging buffer `{label}` through a numpy view: host work a "
                        "replay skips, so every replay uploads the bytes written at capture",
                        module=staging_bytes.OWNER, caller=caller,
                        fix="Refill the staging buffer in prepare(), outside the graph; keep only the upload "
                            "(copy_(..., non_blocking=True)) in the step.")
            for (file, line), (n, fn, label, caller) in sorted(found.items())]
