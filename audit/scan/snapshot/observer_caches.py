"""Caches of the interpreter that the auditor fills itself while a step runs: never the step's state.

The tracer reads source (`linecache.getlines`) to place findings and to read branches, and `inspect` keeps
maps of files to modules as it is asked; each read adds to these tables in the middle of a step. A library
that binds one of them as a module global (beartype's `linecache_cache = linecache.cache`) then looked like
state the step changed: a cpu-side-effect at the library's line, made by the auditor. These tables hold what
the interpreter would re-derive (the text of a file, a module's file); a replay that skips adding to them
computes the same thing, so a module global bound to one of them is not snapshotted.

The interpreter's import tables (`sys.modules`, `sys.path_importer_cache`) are of the same kind: a module the
step imports lazily (beartype binds `sys.modules` as `module_imported_names`; a CUDA step may import a module
on first use) adds one entry; a replay needs the module no more than the first import did.
"""

from __future__ import annotations

import inspect
import linecache
import re
import sys

__all__ = ["is_observer_cache"]

_CACHES = {id(c) for c in (linecache.cache, getattr(inspect, "modulesbyfile", None),
                           getattr(inspect, "_filesbymodname", None), getattr(re, "_cache", None),
                           getattr(re, "_cache2", None), sys.modules, sys.path_importer_cache)
           if isinstance(c, dict)}


def is_observer_cache(v) -> bool:
    """v is one of the interpreter's own lookup caches (by identity), which the auditor's reads fill."""
    return id(v) in _CACHES and isinstance(v, dict)
