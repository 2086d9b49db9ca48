"""Where a module global is changed from another module's code, through the name that module binds it to.

A library keeps a counter or a registry in one module (`parallel_state.STATS = {...}`) and changes it from a
sibling that imported the module (`from distkit import parallel_state as ps`, then `ps.STATS["calls"] += 1` in
comm.py). The owner module's own source holds no statement that changes it, so the cpu-side-effect rule would
find no line. The files of the code the step ran are searched too, when their module binds the owner module
under some name and writes `<name>.GLOBAL` in its source.
"""

from __future__ import annotations

import re
from pathlib import Path

from audit.scan.sources import loaded

__all__ = ["referring_files"]


def referring_files(mod, attr: str, ran) -> list[tuple[str, None, bool]]:
    """(file, None, False) for each file of the code that ran (`ran`: (file, function) pairs) whose module
    binds `mod` at module level under a name written before `.attr` in that file (`ps.STATS`): searched for
    the statements that change `<x>.attr` (global_name False)."""
    own = getattr(mod, "__file__", None)
    if mod is None or own is None:
        return []
    out = []
    for file in sorted({f for f, _ in ran} - {own}):
        m = loaded.module_in(file, last=True)
        names = [n for n, v in vars(m).items() if v is mod] if m is not None else []
        if names and _writes_through(file, names, attr):
            out.append((file, None, False))
    return out


def _writes_through(file: str, names: list[str], attr: str) -> bool:
    """Whether the file's source spells `<name>.attr` for one of the names (cheap pre-check)."""
    try:
        text = Path(file).read_text()
    except OSError:
        return False
    return any(re.search(rf"\b{re.escape(n)}\.{re.escape(attr)}\b", text) for n in names)
