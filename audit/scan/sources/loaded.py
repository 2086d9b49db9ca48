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
            any(m.__dict__ is g for m in _LOOSE.values()) or _NO_MODULE.get(id(g)) is g:
        return
    mod = next((r for r in gc.get_referrers(g) if isinstance(r, types.ModuleType) and r.__dict__ is g), None)
    if mod is not None and getattr(mod, "__file__", None):
        _LOOSE[name if known is None else f"{name}@{mod.__file__}"] = mod
    else:  # code exec'd in a plain dict (`exec(src, {"__name__": ...})`, pytest-xdist's worker), a module of no file
        if len(_NO_MODULE) > 256:
            _NO_MODULE.clear()
        _NO_MODULE[id(g)] = g  # held, so its id is not reused; get_referrers walks the whole heap


_NO_MODULE: dict[int, dict] = {}  # id -> a globals dict no module owns: asked once, not at every frame


def loaded_modules() -> list[tuple[str, types.ModuleType]]:
    """sys.modules, plus the modules loaded by path that the step's code ran in (see note_globals)."""
    return list(sys.modules.items()) + loose_modules()


# Detectors and stand-ins look modules up by their file many times a scan, over thousands of modules once a
# large library is imported. The lookup is rebuilt whenever the set of loaded modules changes: the names and
# objects in sys.modules (a module swapped in under a name it had is a change) and the loose ones.
_INDEX: dict = {}


def _index() -> dict:
    keys, mods, loose = list(sys.modules), list(sys.modules.values()), loose_modules()
    try:
        same = bool(_INDEX) and _INDEX["keys"] == keys and _INDEX["mods"] == mods and _INDEX["loose"] == loose
    except Exception:  # an odd object in sys.modules whose == raises: rebuild
        same = False
    if not same:
        with_files, by_file = [], {}
        for name, mod in list(zip(keys, mods)) + loose:
            f = file_of(mod) if mod is not None else None
            if isinstance(f, str) and f:
                with_files.append((name, mod, f))
                by_file.setdefault(f, []).append((name, mod))
        _INDEX.update(keys=keys, mods=mods, loose=loose, with_files=with_files, by_file=by_file, memo={})
    return _INDEX


def file_of(mod):
    """A loaded module's __file__, read from its own names: a failed attribute lookup on a C extension module
    (torch._C._return_types) costs milliseconds, thousands of modules each time the index is rebuilt."""
    d = getattr(mod, "__dict__", None)
    f = d.get("__file__") if isinstance(d, dict) else None
    return f if f is not None or type(mod) is types.ModuleType else getattr(mod, "__file__", None)


def until_changed(key: str, build):
    """build(sys.modules' (name, module) pairs), remembered under `key` until the loaded modules change."""
    idx = _index()
    memo = idx["memo"]
    if key not in memo:
        memo[key] = build(list(zip(idx["keys"], idx["mods"])))
    return memo[key]


def with_files() -> list[tuple[str, types.ModuleType, str]]:
    """(name, module, __file__) of each loaded module that has a source file, in loaded_modules' order."""
    return _index()["with_files"]


def modules_in(file: str) -> list[tuple[str, types.ModuleType]]:
    """The loaded modules whose __file__ is `file` (as written), in loaded_modules' order: usually one; a
    file run under two names (a target loaded by path that is also importable) has two."""
    return _index()["by_file"].get(file, [])


def module_in(file: str, last: bool = False):
    """The first (or last: a loose module loaded again from a file that sys.modules also has) loaded module
    whose __file__ is `file`, or None."""
    found = modules_in(file)
    return found[-1 if last else 0][1] if found else None


def loose_modules() -> list[tuple[str, types.ModuleType]]:
    """The modules loaded by path that the step's code ran in."""
    return [(n, m) for n, m in list(_LOOSE.items()) if sys.modules.get(n) is not m]


def module_named(name: str):
    """The module a `<module NAME>` state key names (sys.modules or one loaded by path), or None."""
    return _LOOSE.get(name) or sys.modules.get(name)
