"""The Python-visible state of a TorchScript module, which lives in its C++ object, not its __dict__.

`torch.jit.script(module)` keeps the module's attributes (an int call counter, a float scale, a list) in the
compiled object: `sm.calls` reads them through `__getattr__`, and a scripted `forward` that runs
`self.calls += 1` changes them with no Python frame and no __dict__ entry. That is host work a replay never
does, like the same statement in an eager module, so the state snapshot reads these attributes too
(`attrs`), and the statement that changes one is searched in the Python class the module was scripted from
(`source_class`), where its `forward` was written.
"""

from __future__ import annotations

import torch

__all__ = ["attrs", "source_class"]

_SKIP = {"training", "_is_full_backward_hook"}  # nn.Module's own flags, compiled in


def _scripted(obj) -> bool:
    return isinstance(obj, torch.jit.RecursiveScriptModule)


def attrs(obj) -> list[tuple[str, object]]:
    """(name, value) of a scripted module's attributes other than parameters, buffers and submodules."""
    if not _scripted(obj):
        return []
    ct = obj.__dict__.get("_concrete_type")
    try:
        names = ct.get_attributes() if ct is not None else {}
    except Exception:  # noqa: BLE001 - a module loaded from a file keeps no concrete type
        return []
    out = []
    for name, (_typ, is_param) in names.items():
        if is_param or name in _SKIP or name in obj._buffers or name in obj._modules:
            continue
        try:
            value = obj._c.getattr(name)
        except Exception:  # noqa: BLE001 - an attribute TorchScript cannot hand back
            continue
        if not isinstance(value, (torch.Tensor, torch.ScriptObject)):
            out.append((name, value))
    return out


def source_class(obj) -> type:
    """The class whose source holds the object's methods: for a scripted module, the Python class it was
    scripted from; else the object's own class."""
    if _scripted(obj):
        ct = obj.__dict__.get("_concrete_type")
        py = getattr(ct, "py_class", None) if ct is not None else None
        if isinstance(py, type):
            return py
    return type(obj)
