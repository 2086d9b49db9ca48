"""How a state snapshot names a dict key or a set member without running the key's own Python code.

A snapshot used `repr(k)` for keys. A library's `__repr__` may memoize (beartype's `BeartypeConf` fills
`self._repr` on first use), so the auditor's own snapshot changed the object it was about to compare, and the
step was blamed for a cpu-side-effect it never made. Keys whose repr is the interpreter's (str, int, a tuple of
them, an enum member, a type, a function) keep their repr, a dataclass is spelled from its fields, and any
other object with a `__repr__` written in Python is named by its type and identity, as `object.__repr__`
would: a dict keeps the first key object of an equal pair, so the name stays put from step to step.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
import sysconfig
import types

import torch

__all__ = ["key_text"]

_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep
_PRIMS = (type(None), bool, int, float, complex, str, bytes)


def key_text(k, depth: int = 0) -> str:
    """repr(k) where that runs no Python code outside the stdlib, else `<module.Type object at 0x...>`. A
    tensor key hashes by identity (an optimizer's `state[p]`, keyed by parameters): it is named by identity
    and shape, not by its values, so a parameter trained in place stays the same key."""
    if isinstance(k, torch.Tensor):
        return f"<{type(k).__name__} {list(k.shape)} {str(k.dtype).removeprefix('torch.')} #{id(k):x}>"
    if isinstance(k, _PRIMS) or isinstance(k, enum.Enum):
        return repr(k)
    if type(k) is tuple and depth < 4:
        parts = [key_text(x, depth + 1) for x in k]
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    if dataclasses.is_dataclass(k) and not isinstance(k, type) and depth < 4:
        fields = ", ".join(f"{f.name}={key_text(getattr(k, f.name, None), depth + 1)}"
                           for f in dataclasses.fields(k) if f.repr)
        return f"{type(k).__qualname__}({fields})"
    if _safe_repr(type(k)):
        return repr(k)
    t = type(k)
    return f"<{t.__module__}.{t.__qualname__} object at {id(k):#x}>"


@functools.lru_cache(maxsize=4096)
def _safe_repr(t: type) -> bool:
    """The type's __repr__ is C code or a function of the stdlib (a namedtuple's, a type's, a function's)."""
    fn = getattr(t, "__repr__", None)
    if not isinstance(fn, types.FunctionType):
        return True
    try:
        return os.path.realpath(fn.__code__.co_filename).startswith(_STDLIB)
    except (AttributeError, TypeError, ValueError):
        return False
