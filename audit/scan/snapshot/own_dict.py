"""An object's own `__dict__`, read without running its class's `__getattr__`.

`getattr(obj, "__dict__", {})` and `hasattr(obj, "__dict__")` fall back to `__getattr__` when the class has
`__slots__` and no `__dict__`. A lazy proxy answers every name there: llvmlite's `ffi.lib` (imported by numba, so
by librosa) loads its shared library and wraps `__dict__` as a C function, which the snapshot then iterated as a
mapping and the scan stopped. Looking at state must neither run library code nor take a proxy's answer for it."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

_NONE: Mapping = MappingProxyType({})


def own_dict(obj) -> Mapping:
    """obj's `__dict__` when it has one (a class's mappingproxy included), else an empty mapping."""
    try:
        d = object.__getattribute__(obj, "__dict__")
    except Exception:  # noqa: BLE001 - slots only, a C object, a descriptor that raises
        return _NONE
    return d if isinstance(d, Mapping) else _NONE


def has_own_dict(obj) -> bool:
    """Whether obj keeps attributes in a `__dict__` of its own (never asking its `__getattr__`)."""
    try:
        return isinstance(object.__getattribute__(obj, "__dict__"), Mapping)
    except Exception:  # noqa: BLE001
        return False
