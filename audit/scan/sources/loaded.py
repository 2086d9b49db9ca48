"""Modules the step's code ran in: sys.modules, and those loaded by path without registering there.

A helper or plugin loaded with `importlib.util.spec_from_file_location` + `module_from_spec` +
`exec_module` never enters sys.modules, yet its globals are Python state like any module's. The
tracer hands the globals of every frame it sees to `note_globals`; the module is found from them.
"""

from __future__ import annotations

import gc
import sys
import types

_LOOSE: dict[str, types.ModuleType] = {}  # label -> a module run from a file but not in sys.modules


def note_globals(g: dict) -> None:
    """Registers the module whose globals `g` are, when the step ran its code and it is not in
    sys.modules: a plugin or helper loaded by path (`importlib.util.spec_from_file_location` +
    `module_from_spec` + `exec_module`) is a module like any other; its globals are state too."""
    name = g.get("__name__")
    known = sys.modules.get(name) if isinstance(name, str) else None
    if not isinstance(name, str) or (known is not None and known.__dict__ is g) or \
            any(m.__dict__ is g for m in _LOOSE.values()):
        return
    mod = next((r for r in gc.get_referrers(g) if isinstance(r, types.ModuleType) and r.__dict__ is g), None)
    if mod is not None and getattr(mod, "__file__", None):
        _LOOSE[name if known is None else f"{name}@{mod.__file__}"] = mod


def loaded_modules() -> list[tuple[str, types.ModuleType]]:
    """sys.modules, plus the modules loaded by path that the step's code ran in (see note_globals)."""
    return list(sys.modules.items()) + loose_modules()


def loose_modules() -> list[tuple[str, types.ModuleType]]:
    """The modules loaded by path that the step's code ran in."""
    return [(n, m) for n, m in list(_LOOSE.items()) if sys.modules.get(n) is not m]


def module_named(name: str):
    """The module a `<module NAME>` state key names (sys.modules or one loaded by path), or None."""
    return _LOOSE.get(name) or sys.modules.get(name)
