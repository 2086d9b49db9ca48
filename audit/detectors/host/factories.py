"""Whether a `torch.<factory>(...)` call makes its tensor in host memory on the GPU the step is deployed on.

Naming the CPU, it does. Naming no device, it follows torch's default device: host memory, unless the target
put a default device in force (`torch.set_default_device(device)` in make(), read before each audited step
into the trace) or the call sits in a `with torch.device(...):` block. On a CPU scan that default is the
CPU too, so only that it was set tells the two apart.
"""

from __future__ import annotations

import ast
import contextvars

from audit.detectors.source.lookup import HOST_FACTORIES, _calls_on, _device_kw, _on_cpu, _span, enclosing_function

__all__ = ["DEFAULT_DEVICE_SET", "factory_on_device", "factory_on_host", "follows_default"]

# the target put torch's default device in force (`torch.set_default_device(device)` in make()): a factory
# naming no device follows it, onto the GPU where the step is deployed (set per scan by detectors.run)
DEFAULT_DEVICE_SET: contextvars.ContextVar[bool] = contextvars.ContextVar("default_device_set", default=False)


def follows_default(filename: str, line: int) -> bool:
    """A factory on `line` naming no device lands on the default device the target set, not in host memory."""
    return DEFAULT_DEVICE_SET.get() or _in_device_block(filename, line)


def factory_on_host(filename: str, line: int) -> bool:
    """A `torch.<factory>(...)` call on `line` that names the CPU, or names no device while no default
    device is in force (set for the process, or a `with torch.device(...):` around it): its tensor is born
    in host memory (then `.to(device)` is a host->device copy)."""
    for n in _calls_on(filename, line, HOST_FACTORIES):
        if isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) and n.func.value.id == "torch":
            dev = _device_kw(n, filename)
            if dev is not None and _on_cpu(filename, dev):
                return True
            if dev is None and not follows_default(filename, line):
                return True
    return False


def factory_on_device(filename: str, line: int) -> bool:
    """A `torch.<factory>(..., device=D)` call on `line`, D not the CPU (or naming no device under a default
    device the target set): its tensor is born on the step's device, so a host value written into it in the
    step (`oh = torch.zeros(v, device=dev); oh[eos] = 1.0`, torch's setitem copying a CPU scalar) is a copy
    from pageable memory on a GPU."""
    for n in _calls_on(filename, line, HOST_FACTORIES):
        if isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) and n.func.value.id == "torch":
            dev = _device_kw(n, filename)
            if (dev is not None and not _on_cpu(filename, dev)) or (dev is None and follows_default(filename, line)):
                return True
    return False


def _in_device_block(filename: str, line: int) -> bool:
    """`line` sits in a `with torch.device(...):` block of its function."""
    func = enclosing_function(filename, line)
    return any(isinstance(w, ast.With) and _span(w, line) and any(
        isinstance(i.context_expr, ast.Call) and ast.unparse(i.context_expr.func) in ("torch.device", "device")
        for i in w.items) for w in ast.walk(func) if func is not None)
