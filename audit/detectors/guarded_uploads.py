"""pageable-copy the run could not see: host data sent to the device in branches a CPU scan never takes.

A kernel wrapper that builds launch metadata from host data only on its GPU path (`if x.is_cuda: offs =
torch.tensor(host_lens, device=x.device); kernel[grid](x, offs)`, with a PyTorch fallback for the CPU) runs
the fallback on a laptop, so no copy is traced. On a GPU the branch copies Python data from pageable memory
inside the step: capture raises, and a replay would keep the values of the capture anyway. The GPU side is read
from the source (the same untaken sides guarded_sync reads, and the helpers they call): a
`torch.tensor / as_tensor / asarray(data, device=D)` or `t.new_tensor(data)` naming no CPU device, or a `.to(D)`
/ `.cuda()` of a tensor built from host data in the same expression (`torch.from_numpy(a).to(dev)`). Pinned
staging (`pin_memory=True`, `.pin_memory()` on the way) is not this. CUDA scans skip this rule: there the branch
either ran (and the copy was traced) or is not taken.
"""

from __future__ import annotations

import ast

from audit.detectors import register
from audit.detectors.guarded_sync import found_in_untaken_sides
from audit.detectors.source import lookup
from audit.detectors.source.stored_back import MOVES

_BUILDS = ("tensor", "as_tensor", "asarray")  # take host data and a device= to land it on
_HOST_BORN = (*_BUILDS, "from_numpy", "frombuffer", "LongTensor", "IntTensor", "FloatTensor", "BoolTensor",
              "Tensor")  # make a tensor in host memory from Python or numpy data


def _names_cpu(dev: ast.expr) -> bool:
    """A device argument written as the CPU (`"cpu"`, `torch.device("cpu")`, a name saying cpu)."""
    return "cpu" in ast.unparse(dev).lower()


def _pinned(call: ast.Call) -> bool:
    """The call pins its host tensor (`pin_memory=True`, or `.pin_memory()` somewhere in its receiver chain)."""
    return any(isinstance(n, ast.Call) and (any(k.arg == "pin_memory" for k in n.keywords)
               or getattr(n.func, "attr", "") == "pin_memory") for n in ast.walk(call))


def _host_born(expr: ast.expr) -> bool:
    """A call that makes a tensor from host data with no device named (`torch.from_numpy(a)`, `torch.tensor(l)`)."""
    return isinstance(expr, ast.Call) and getattr(expr.func, "attr", getattr(expr.func, "id", "")) in _HOST_BORN \
        and not any(k.arg == "device" for k in expr.keywords)


def _target(call: ast.Call):
    """The device a `.to(...)` / `.cuda(...)` call names: its first argument or `device=`, `True` for `.cuda()`."""
    if call.func.attr == "cuda":
        return True
    dev = next((k.value for k in call.keywords if k.arg == "device"), call.args[0] if call.args else None)
    if dev is None or (isinstance(dev, ast.Attribute) and ast.unparse(dev).startswith("torch.")
                       and "device" not in ast.unparse(dev)):
        return None  # `.to(torch.float16)`: a dtype, no move
    return dev


def upload(call) -> str | None:
    """The call as written when it sends host data to a device from pageable memory, else None."""
    if not isinstance(call, ast.Call) or _pinned(call):
        return None
    name = getattr(call.func, "attr", getattr(call.func, "id", ""))
    dev = next((k.value for k in call.keywords if k.arg == "device"), None)
    if name in _BUILDS and dev is not None and not _names_cpu(dev):
        return ast.unparse(call.func)
    if name == "new_tensor" and isinstance(call.func, ast.Attribute) and (dev is None or not _names_cpu(dev)):
        return ast.unparse(call.func)
    if name in MOVES and isinstance(call.func, ast.Attribute) and _host_born(call.func.value):
        dev = _target(call)
        if dev is True or (dev is not None and not _names_cpu(dev)):
            return f"{ast.unparse(call.func.value.func)}(...).{name}"
    return None


def _own(file: str, call: ast.Call) -> bool:
    """In the branch's own function, a device name assigned only the CPU is no device either."""
    dev = next((k.value for k in call.keywords if k.arg == "device"), None)
    return dev is None or not lookup._on_cpu(file, dev)


@register("pageable-copy")
def uploads_in_untaken_device_branches(ctx):
    """On a CPU scan: host data sent to the device in device-guarded branches of code the step ran."""
    if ctx.cuda:
        return []
    return [ctx.finding(
        "pageable-copy", (ufile, line, fname), what, 0.0,
        f"`{what}()`{via} sits in a branch guarded by `{ast.unparse(node.test)}` that this CPU scan did "
        "not take; on the GPU it copies host data from pageable memory inside the step, which capture "
        "refuses, and a replay would keep the values of the capture (found in the source, not traced)",
        fix="Build the data on the device, or keep a persistent device (or pinned) buffer refilled "
            "outside the captured region.",
        caller=caller) for ufile, line, fname, what, via, node, caller in found_in_untaken_sides(ctx, upload, _own)]
