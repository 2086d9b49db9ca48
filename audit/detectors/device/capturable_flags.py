"""An optimizer built `capturable` on a GPU only: `torch.optim.Adam(..., capturable=on_gpu)`.

torch refuses `capturable=True` for parameters on the CPU, so a target that is also scanned on the CPU
passes a device test (`capturable=torch.cuda.is_available()`, or a flag assigned one:
`on_gpu = torch.device(device).type == "cuda"`). A CPU scan then runs the other optimizer path: the step
counter on the host, the bias correction computed in Python and read back with `.item()`. A GPU runs the
capturable path, which does all of that on the device. What the scan traced inside such an optimizer's
`step()` (between torch.optim's `Optimizer.step#Adam.step` record_function enter and exit) is the CPU's
side of that device test, as an op on the CPU side of `if x.is_cuda:` is (cpu_only.py).
"""

from __future__ import annotations

import ast

from audit.detectors.source import lookup, scopes
from audit.scan.sources.ast_nodes import nodes_of

__all__ = ["cpu_only", "gpu_capturable"]

_ENTER, _EXIT = "profiler._record_function_enter_new", "profiler._record_function_exit"


def _func_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def gpu_capturable(ctx, opt) -> tuple[str, str, int] | None:
    """(file, test text, line) when every construction of the optimizer's class in the target's own files
    passes `capturable=` a device test, which this CPU run read false; else None."""
    if ctx.cuda or any(g.get("capturable") for g in opt.param_groups):
        return None
    name, hits = type(opt).__name__, []
    for file in ctx.own_files():
        tree = lookup.tree(file)
        for call in nodes_of(tree, ast.Call) if tree is not None else ():
            if _func_name(call) == name:
                kw = next((k.value for k in call.keywords if k.arg == "capturable"), None)
                hits.append((file, tree, call, kw))
    if not hits or any(kw is None or not scopes.device_test(tree, kw, call.lineno) for _, tree, call, kw in hits):
        return None
    file, _, call, kw = hits[0]
    return file, ast.unparse(kw), call.lineno


def _labels(ctx) -> dict[str, tuple]:
    """record_function label -> (file, test, line) of the optimizers capturable on a GPU only."""
    from audit.detectors.device.optimizer_steps import optimizers

    out = {}
    for _, opt in optimizers(ctx):
        if (hit := gpu_capturable(ctx, opt)) is not None:
            out[f"Optimizer.step#{type(opt).__name__}.step"] = hit
    return out


def cpu_only(ctx, rec):
    """(file, what a GPU does instead, line) when the record ran inside the step of an optimizer that a GPU
    builds capturable, else None."""
    cache = ctx.__dict__.setdefault("_capturable_ranges", {})
    if "labels" not in cache:
        cache["labels"] = _labels(ctx)
    if not cache["labels"] or rec is None:
        return None
    if rec.step not in cache:
        inside, open_ = {}, []
        for r in ctx.steps[rec.step]:
            if r.op == _ENTER:
                open_.append(r.args[0] if r.args else "")
            elif r.op == _EXIT and open_:
                open_.pop()
            hit = next((cache["labels"][n] for n in open_ if n in cache["labels"]), None)
            if hit is not None:
                inside[id(r)] = hit
        cache[rec.step] = inside
    hit = cache[rec.step].get(id(rec))
    return None if hit is None else (hit[0], f"a GPU builds the optimizer with `capturable={hit[1]}` true", hit[2])
