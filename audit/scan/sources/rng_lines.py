"""The lines that ran in an audited step in the functions that can draw from a host random generator the target holds.

A numpy `Generator` draws in C from a Cython method: no Python event marks the call, and a function that draws and
runs no torch op (gymnasium's `Discrete.sample`: `self.np_random.integers(n)` beside two `choice` branches for a
mask or a probability) leaves no op stack to say which statement ran. While the target holds such a generator (or a
`random.Random`), a line tracer watches the functions outside torch and the stdlib whose code names the attribute
holding it, or a property of the holder's class that returns it (`np_random` -> `_np_random`); the detectors keep
the drawing statements that ran (audit/detectors/state/drawn.py). A target holding no generator is not traced.
"""

from __future__ import annotations

import contextlib
import random
import sys

from audit.scan.snapshot.own_dict import own_dict
from audit.scan.sources.user_code import HIDDEN, frame_kind

__all__ = ["is_rng", "recording", "watched_names"]


def is_rng(v) -> bool:
    """A host random generator object: `random.Random`, numpy's `Generator` or `RandomState`."""
    return isinstance(v, random.Random) or (type(v).__module__ or "").startswith("numpy.random")


def watched_names(objects) -> set[str]:
    """Attribute names holding a host generator on a reachable object, and the names of the holder class's
    properties whose getter reads one."""
    names: set[str] = set()
    for _, obj in objects:
        d = own_dict(obj)
        if not isinstance(d, dict):
            continue
        for k, v in list(d.items()):
            if not is_rng(v):
                continue
            names.add(k)
            names |= {n for cls in type(obj).__mro__ for n, p in list(vars(cls).items()) if isinstance(p, property)
                      and k in getattr(getattr(p.fget, "__code__", None), "co_names", ())}
    return names


@contextlib.contextmanager
def recording(tracer):
    """Appends this step's set of (file, line) run in the watched functions to `tracer.trace.ran_lines`."""
    lines: set = set()
    tracer.trace.ran_lines.append(lines)
    names = watched_names(tracer.trace.objects)
    if not names or sys.gettrace() is not None:  # nothing to watch, or a debugger / coverage owns the hook
        yield
        return
    kinds: dict = {}  # id(code) -> (code, watched)

    def local(frame, event, arg):
        if event == "line":
            lines.add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def glob(frame, event, arg):
        code = frame.f_code
        ent = kinds.get(id(code))
        if ent is None or ent[0] is not code:
            ent = kinds[id(code)] = (code, bool(names.intersection(code.co_names))
                                     and frame_kind(code.co_filename, tracer.trace.roots) != HIDDEN)
        return local if ent[1] else None

    sys.settrace(glob)
    try:
        yield
    finally:
        sys.settrace(None)
