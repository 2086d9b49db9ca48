"""Class-level state: the attributes of user and library classes a step may change.

The classes are those of the objects reachable from the target and those the state modules define
(a processor the step instantiates and drops, whose metaclass counts instances on the class). Each
is recorded under its `<class Q>` label, so the side-effect rule can read the class's (and its
metaclass's) source for the statement that changed it. The process-wide host random generators are
added here too (audit.scan.snapshot.global_rng), and the bytes of pinned staging buffers (audit.scan.snapshot.staging_bytes).
"""

from __future__ import annotations

import types

from torch import nn

from audit.scan.snapshot import global_rng, staging_bytes, state
from audit.scan.snapshot.fingerprint import PLAIN
from audit.scan.snapshot.fingerprint import fp as fingerprint

CLASSES: dict[str, type] = {}  # `<class Q>` state-key owner -> the class


def user_classes(objects, modules=()) -> list[type]:
    """The user-defined classes (and user bases) of the reachable objects, and the classes the state
    modules define (a processor the step instantiates and drops, whose metaclass counts instances on
    it), once each."""
    seen: dict[int, type] = {}
    for _, obj in objects:
        for cls in type(obj).__mro__:
            if (getattr(cls, "__module__", "") or "").split(".")[0] not in state._FOREIGN:
                seen.setdefault(id(cls), cls)
    named = {c.__qualname__ for c in seen.values()}  # their labels: a module's class of the same name (another
    for name, mod in modules:                        # file's `Cache`, a stale copy of the target's module) waits
        for v in list(vars(mod).values()):
            if isinstance(v, type) and v.__module__ == name and not issubclass(v, BaseException) \
                    and (id(v) in seen or v.__qualname__ not in named):
                seen.setdefault(id(v), v)
                named.add(v.__qualname__)
    return list(seen.values())


def class_state(cls: type) -> dict:
    """Class attributes (`Decoder.total_steps += 1`), the attributes of user objects kept on the class
    (a descriptor's own counters), and the closure cells of the class's methods
    (`nonlocal count` in a class defined inside a factory): state a step can change."""
    out = {}
    CLASSES[f"<class {cls.__qualname__}>"] = cls
    for k, v in list(vars(cls).items()):
        if k.startswith("__"):
            continue
        if isinstance(v, PLAIN):
            out[(f"<class {cls.__qualname__}>", k)] = fingerprint(v)
        elif state._is_user_object(v) and not isinstance(v, nn.Module):  # a descriptor counting its hits
            out.update(((f"<class {cls.__qualname__}>", f"{k}.{a}"), fp) for a, fp in state._attrs(v))
        fn = v.__func__ if isinstance(v, (staticmethod, classmethod)) else v
        if isinstance(fn, types.FunctionType):
            for name, fp in state._cells(fn):
                out[(f"<closure {fn.__qualname__}>", name, id(fn))] = fp  # two classes of one name: two cells
    return out


def snapshot(objects, modules) -> dict:
    """state.snapshot of the objects and modules, plus the state of their classes and of the classes
    the modules define."""
    snap = state.snapshot(objects, modules)
    for cls in user_classes(objects, modules):
        snap.update(class_state(cls))
    snap.update(global_rng.snapshot())  # `random` / `np.random`: state in C, no attribute changes
    snap.update(staging_bytes.snapshot(objects))  # pinned staging buffers written through a numpy view
    return snap
