"""What the audited step can reach: module names for attribution, Python state for side effects.

A graph replays kernels, not Python: whatever Python state the step changes (a position counter, a list of past
tokens, a rebound attribute) changes once at capture and never again. We find those by snapshotting the plain (non-
tensor) attributes of every object reachable from the target, and of the user modules' globals, right before and
right after each audited step."""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import sys
import types
from collections import deque
from dataclasses import dataclass

import torch
from torch import nn

from audit.scan.snapshot.fingerprint import PLAIN, fp as fingerprint, members
from audit.scan.patches import mp_queues, threads
from audit.scan.snapshot import script_state, subclass_state, torch_state, value_objects
from audit.scan.snapshot.own_dict import has_own_dict, own_dict
from audit.scan.sources import user_code
from audit.scan.snapshot.held_tensors import storage_id, tensor_attrs
from audit.scan.snapshot.observer_caches import is_observer_cache
from audit.scan.sources import loaded

__all__ = ["StateChange", "diff", "module_names", "reachable", "snapshot", "storage_id", "tensor_attrs"]

_FOREIGN = ("torch", "builtins", "numpy", "pandas", "typing", "collections", "enum", "functools",
            "cupy", "triton", "cutlass", "cuda", "numba")  # kernel objects: their caches are the compiler's, not state
_SKIP_ATTRS = {"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"}
_SLOTS: dict[type, tuple[str, ...]] = {}  # a class -> the __slots__ names it and its bases declare


def _is_user_object(v) -> bool:
    """Instances of user classes (not torch/stdlib) whose attributes we should look into: with a
    __dict__, or with __slots__ (`@dataclass(slots=True)` request state)."""
    if isinstance(v, functools.partial):  # a logits processor bound with `state={}`: its arguments
        return True
    t = type(v)
    mod = getattr(t, "__module__", "") or ""
    if mp_queues.is_mp_queue(v):  # compared by the items put (audit/scan/patches/mp_queues.py), not its feeder's buffer
        return False
    if torch_state.is_training_state(v):  # an optimizer, an LR scheduler: its Python attributes are step state
        return True
    return (has_own_dict(v) or bool(_slot_names(t))) and not isinstance(
        v, (type, types.ModuleType, types.FunctionType, types.MethodType)) and mod.split(".")[0] not in _FOREIGN


def _slot_names(t: type) -> tuple[str, ...]:
    """The __slots__ attribute names a class and its bases declare (cached per class)."""
    names = _SLOTS.get(t)
    if names is None:
        names = []
        for cls in t.__mro__:
            sl = cls.__dict__.get("__slots__", ())
            names += [sl] if isinstance(sl, str) else [n for n in sl if n not in ("__dict__", "__weakref__")]
        names = _SLOTS[t] = tuple(dict.fromkeys(names))
    return names


def _bound_args(p: functools.partial) -> list[tuple[str, object]]:
    """(parameter, value) of the arguments a partial froze: a function that mutates one of them
    (`state["n"] += 1` on `partial(penalty, state={})`) changes state the partial keeps across steps."""
    try:
        return list(inspect.signature(p.func).bind_partial(*p.args, **p.keywords).arguments.items())
    except (TypeError, ValueError):  # a builtin without a signature, arguments that do not bind
        return [(f"args[{i}]", a) for i, a in enumerate(p.args)] + list(p.keywords.items())


def _instance_items(obj) -> list[tuple[str, object]]:
    """An object's attributes: its __dict__, then any __slots__ that are set; a functools.partial's
    frozen arguments, by the names of its function's parameters."""
    if isinstance(obj, functools.partial):  # a bound method it wraps: its object (`partial(counter.on_step)`)
        return _bound_args(obj) + ([("func", obj.func)] if isinstance(obj.func, types.MethodType) else [])
    items = list(own_dict(obj).items()) + script_state.attrs(obj)  # a scripted module's, in C++
    for name in _slot_names(type(obj)):
        try:
            items.append((name, getattr(obj, name)))
        except AttributeError:  # a slot never assigned
            continue
    return items


def reachable(root, max_depth: int = 8, limit: int = 50000) -> list[tuple[str, object]]:
    """(path, obj) for root and every module / user object reachable through attributes and
    containers, breadth first (so each object gets its shortest path). root's path is ''.
    Module trees are followed to any depth; other objects up to `max_depth` hops."""
    out: list[tuple[str, object]] = []
    seen: set[int] = set()
    todo = deque([("", root, 0)])
    while todo and len(out) < limit:
        path, obj, depth = todo.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        out.append((path, obj))
        for name, v in _children(obj):
            sub = f"{path}.{name}" if path else name
            if isinstance(v, (list, tuple)) and len(v) <= 4096:
                pairs = [(f"{sub}.{i}", x) for i, x in enumerate(v)]
            elif isinstance(v, dict) and len(v) <= 4096:
                pairs = [(f"{sub}.{k}", x) for k, x in v.items()]
            else:
                pairs = [(sub, v)]
            for p, x in pairs:
                if isinstance(x, types.MethodType) and _is_user_object(x.__self__):
                    p, x = f"{p}.__self__", x.__self__  # a callback list of bound methods: their objects
                if isinstance(x, nn.Module):
                    todo.append((p, x, depth))
                elif _is_user_object(x) and depth < max_depth:
                    todo.append((p, x, depth + 1))
    return out


def _children(obj):
    if isinstance(obj, nn.Module):
        yield from obj._modules.items()
        yield from subclass_state.held_weights(obj)  # a quantized weight's own Python state
    yield from ((k, v) for k, v in _instance_items(obj) if k not in _SKIP_ATTRS)


def module_names(objects: list[tuple[str, object]]) -> dict[int, str]:
    """id(module) -> dotted path from the target (the root module itself: its class name)."""
    names = {}
    for path, obj in objects:
        if isinstance(obj, nn.Module) and id(obj) not in names:
            names[id(obj)] = path or type(obj).__name__
    return names


# ---------------------------------------------------------------------- snapshots
def _keys(d) -> tuple:
    """The names in a module's parameter / buffer / submodule table; a TorchScript module's tables are
    C++ wrappers that iterate only through keys() (`tuple(d)` raises there)."""
    try:
        return tuple(d.keys())
    except Exception:  # noqa: BLE001 - a table we cannot list
        return ("<unreadable>",)


def _attrs(obj):
    if isinstance(obj, nn.Module):
        yield "_parameters", ("keys", _keys(obj._parameters))
        yield "_buffers", ("keys", _keys(obj._buffers))
        yield "_modules", ("keys", _keys(obj._modules))
    for k, v in _instance_items(obj):
        if k in _SKIP_ATTRS or "hooks" in k or isinstance(v, (nn.Module, types.FunctionType, types.MethodType)) \
                or threads.scheduling_state(obj, k):
            continue
        if _is_user_object(v) and not isinstance(v, functools.partial):  # a copy-on-write state object
            yield k, value_objects.snapshot(v, _instance_items(v), fingerprint)
        else:
            yield k, fingerprint(v)
        if isinstance(v, torch.Tensor):  # Python attributes set on a tensor (`cache.filled += 1`)
            yield from ((f"{k}.{a}", fp) for a, fp in _plain_dict(v))


def _plain_dict(obj) -> list[tuple[str, object]]:
    """(name, fingerprint) of the plain values in an object's own __dict__ (a tensor's or a function's
    Python attributes: `note_step.calls`)."""
    d = own_dict(obj)
    if not isinstance(d, dict):
        return []
    return [(k, fingerprint(x)) for k, x in list(d.items()) if not k.startswith("__") and isinstance(x, PLAIN)]


def _functions(obj):
    """Plain functions hung on an object: attributes, and members of its list / tuple / dict attributes
    (a list of logits-processor closures, a module's forward-hook dict), also behind a bound method or a
    partial (a patched `mod.forward = types.MethodType(fwd, mod)` or `partial(fwd, mod, orig)`)."""
    for k, v in list(own_dict(obj).items()):
        if (fn := _plain_function(v)) is not None:
            yield fn
        elif isinstance(v, (list, tuple, dict)) and len(v) <= 4096:
            yield from (x for x in (v.values() if isinstance(v, dict) else v) if isinstance(x, types.FunctionType))


def _plain_function(v):
    """The Python function a value calls: itself, a bound method's function, a partial's (nested), else None."""
    for _ in range(4):
        if isinstance(v, types.FunctionType):
            return v
        v = v.__func__ if isinstance(v, types.MethodType) else v.func if isinstance(v, functools.partial) else None
    return None


GENERATED: dict[str, dict] = {}  # `<globals Q>` -> {id: function} exec'd into a plain namespace


def _function_state(fn) -> dict:
    """A function's state a step can change: its closure cells (`nonlocal n`), its attributes, and the globals
    of a function exec'd into a plain namespace (no module: `exec(src, ns)`, `ns["COUNT"]["n"] += 1`)."""
    out = {(f"<closure {fn.__qualname__}>", name, id(fn)): fp for name, fp in _cells(fn)}  # lambdas share a qualname
    out.update(((f"<function {fn.__qualname__}>", k), fp) for k, fp in _plain_dict(fn))
    if "__name__" not in fn.__globals__:
        GENERATED.setdefault(f"<globals {fn.__qualname__}>", {})[id(fn)] = fn  # one helper made twice: two namespaces
        out.update(((f"<globals {fn.__qualname__}>", k, id(fn)), fingerprint(v)) for k, v in list(fn.__globals__.items())
                   if not k.startswith("__") and isinstance(v, PLAIN))
    return out


def _cells(fn) -> list[tuple[str, object]]:
    """(free variable, fingerprint) of a function's plain closure cells (`nonlocal n`)."""
    out = []
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            val = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(val, PLAIN):
            out.append((name, fingerprint(val)))
    return out


def user_modules(roots: tuple[str, ...]) -> list[tuple[str, types.ModuleType]]:
    """Imported modules whose source counts as user code, with `roots` the target's own (their globals are state
    too); asked again only when the loaded modules change."""
    def build(_pairs):
        return [(name, mod) for name, mod, f in loaded.with_files()
                if os.path.isabs(f) and name.split(".")[0] not in _FOREIGN and user_code.is_user_file(f, roots)]
    return list(loaded.until_changed(("state.user_modules", roots), build))


def installed_modules(files: set) -> list[tuple[str, types.ModuleType]]:
    """The imported modules whose source is one of `files` (real paths): installed library modules
    whose code a step ran, added to the state modules by the tracer."""
    out = []
    for name, mod, f in loaded.with_files():
        if name.split(".")[0] not in _FOREIGN and user_code.real_path(f) in files:
            out.append((name, mod))
    return out


def snapshot(objects: list[tuple[str, object]], modules: list[tuple[str, types.ModuleType]]) -> dict:
    """(owner path, attribute) -> fingerprint, for reachable objects and user-module globals (their
    classes' state: class_state.snapshot)."""
    snap = {}
    for path, obj in objects:
        for k, fp in _attrs(obj):
            snap[(path, k)] = fp
        for fn in _functions(obj):  # a closure hung on the object: its cells are state
            snap.update(_function_state(fn))
    for name, mod in modules:
        for k, v in list(vars(mod).items()):
            if k.startswith("__") or isinstance(v, (types.ModuleType, type, types.BuiltinFunctionType)) \
                    or is_observer_cache(v):  # linecache.cache under a library's name: the auditor fills it
                continue
            if isinstance(v, types.FunctionType):  # a decorated function's `nonlocal` counters, its attributes
                snap.update(_function_state(v))
            elif isinstance(v, PLAIN):
                snap[(f"<module {name}>", k)] = fingerprint(v)
                snap.update(((f"<module {name}>", f"{k}{sub}"), fp) for sub, fp in _member_objects(v))
            elif isinstance(v, contextvars.ContextVar):  # a request-scoped counter: its value in this context
                snap[(f"<module {name}>", k)] = fingerprint(v.get("<unset>"))
            elif _is_user_object(v):  # a global metrics / config object: its attributes, and those of the objects it
                # holds (a prometheus `Counter` keeps its count in a value object: `TOKENS._value._value`), keyed by
                # the held object too: one the step rebinds is the holder's change, not each of its attributes'
                snap.update(((f"<module {name}>", f"{k}.{a}"), fp) for a, fp in _attrs(v))
                for sub, x in _held(v):
                    snap.update(((f"<module {name}>", f"{k}.{sub}.{a}", id(x)), fp) for a, fp in _attrs(x))
            else:  # another object (an async collective's Work handle kept for the next step): rebinding it is state
                snap[(f"<module {name}>", k)] = fingerprint(v)
    return snap


def _held(v) -> list[tuple[str, object]]:
    """(path, object) of the objects a global object holds, two hops down, that are neither modules nor of the
    standard library (a library's `logger` holds its manager's table of every logger: not metrics state)."""
    def std(x):
        return (type(x).__module__ or "").split(".")[0] in sys.stdlib_module_names
    return [] if isinstance(v, nn.Module) or std(v) else \
        [(p, x) for p, x in reachable(v, max_depth=2, limit=64)[1:] if not std(x)]


def _member_objects(v) -> list[tuple[str, object]]:
    """(`[key].attr`, fingerprint) of the user objects a module-level list or dict holds (a metrics
    registry `{name: Histogram}`): their attributes are state as a global object's are."""
    pairs = members(v) if isinstance(v, (dict, list, tuple, deque)) else []
    pairs = (pairs if isinstance(v, dict) else list(enumerate(pairs))) if len(pairs) <= 4096 else []
    return [(f"[{key!r}].{a}", fp) for key, x in pairs if _is_user_object(x) and not isinstance(x, nn.Module)
            for a, fp in _attrs(x)]


@dataclass
class StateChange:
    owner: str          # path from the target ("model.layers.0.attn"), or "<module pkg.mod>"
    attr: str
    before: object
    after: object

    @property
    def tensor_members_only(self) -> bool:
        """The change is only which tensor objects a container holds (a slot rebound to a new tensor)."""
        return _masked(self.before) == _masked(self.after)

    def tensor_rebound(self, key) -> bool:
        """The container's element at `key` changed only in which tensor it holds (`d["hist"] = torch.roll(...)`)."""
        va, vb = _element(self.before, key), _element(self.after, key)
        return va is not None and vb is not None and va != vb and _masked(va) == _masked(vb)

    def element_unchanged(self, key) -> bool:
        """The container's element at `key` is there before and after the step, equal."""
        va = _element(self.before, key)
        return va is not None and va == _element(self.after, key)

    def describe(self, key=None) -> str:
        """What changed, down to the element; `key`: the element a given line writes (`stats["active"]`),
        named first when it is one of those that changed."""
        where = f"{self.owner}.{self.attr}" if self.owner and not self.owner.startswith("<") else self.attr
        a, b = self.before, self.after
        if _is_container(a) and _is_container(b) and a[:2] == b[:2]:
            pairs = sorted(zip(_items(a), _items(b)), key=lambda p: key is None or p[0][0] not in (key, repr(key)))
            for (ka, va), (kb, vb) in pairs:  # same size: name the element that changed
                if ka == kb and va != vb:
                    inner = StateChange("", f"{where}[{ka}]", va, vb).describe()  # nested: down to the leaf
                    return inner if _is_container(va) and _is_container(vb) else f"`{where}[{ka}]` ({_show(va)} -> {_show(vb)})"
        if _is_set(a) and _is_set(b):  # same size or not: which members left and came
            gone, came = sorted(set(a[2]) - set(b[2])), sorted(set(b[2]) - set(a[2]))
            return f"`{where}` (removed {', '.join(gone) or 'nothing'}; added {', '.join(came) or 'nothing'})"
        return f"`{where}` ({_show(a)} -> {_show(b)})"


def _masked(fp):
    """A fingerprint with its tensor members' identities blanked."""
    if isinstance(fp, tuple) and len(fp) == 2 and fp[0] == "tensor":
        return "<tensor>"
    if isinstance(fp, tuple):
        return tuple(_masked(x) for x in fp)
    return fp


def _is_container(fp) -> bool:
    """A container fingerprint kept element by element (not a digest)."""
    return isinstance(fp, tuple) and len(fp) == 3 and fp[0] in ("list", "tuple", "deque", "dict") \
        and isinstance(fp[2], tuple)


def _is_set(fp) -> bool:
    return isinstance(fp, tuple) and len(fp) == 3 and fp[0] in ("set", "frozenset") and isinstance(fp[2], tuple)


def _element(fp, key):
    """The fingerprint of a container's element at `key` (a negative index counts from a sequence's end), else None."""
    if not _is_container(fp):
        return None
    if fp[0] != "dict" and type(key) is int and key < 0:
        key += len(fp[2])
    return next((v for k, v in _items(fp) if k in (key, repr(key))), None)


def _items(fp):
    if fp[0] == "dict":
        return list(fp[2])
    return list(enumerate(fp[2]))


def diff(before: dict, after: dict) -> list[StateChange]:
    out = []
    for key in before.keys() | after.keys():
        if len(key) > 2 and (key not in before or key not in after):
            continue  # a function made or dropped by the step: its cells did not change (the container did)
        a, b = before.get(key, "<unset>"), after.get(key, "<unset>")
        if a != b and not value_objects.same_value(a, b):
            out.append(StateChange(key[0], key[1], *value_objects.plain_pair(a, b)))
    return sorted(out, key=lambda c: (c.owner, c.attr))


def _show(fp) -> str:
    if isinstance(fp, tuple) and len(fp) == 2 and fp[0] == "tensor":
        view = fp[1]
        return f"tensor {list(view[2])} at storage #{view[0] & 0xFFFF:04x}+{view[1]}" if len(view) == 5 else "a tensor"
    if isinstance(fp, tuple) and fp and fp[0] in ("list", "tuple", "deque", "dict", "set", "frozenset"):
        return f"{fp[0]} of {fp[1]}"
    if isinstance(fp, tuple) and len(fp) == 2 and fp[0] == "obj":
        return fp[1]  # an object shown by its state, e.g. count(3)
    if isinstance(fp, tuple) and fp and fp[0] == "obj":
        return f"<{fp[1]} object>"
    if isinstance(fp, tuple) and fp and fp[0] == "ndarray":
        return f"array{list(fp[3])}" if isinstance(fp[3], tuple) else f"<ndarray {list(fp[1])} {fp[2]}>"
    if isinstance(fp, tuple) and fp and fp[0] == "array":
        return f"array('{fp[1]}') of {fp[2]}"
    if isinstance(fp, tuple) and len(fp) == 3 and fp[0] in ("bytearray", "memoryview", "mmap"):
        return f"<{fp[0]} of {fp[1]} bytes, contents #{fp[2] & 0xFFFF:04x}>"  # a hash of the bytes: it changed
    if isinstance(fp, tuple) and fp and fp[0] == "keys":
        return "{" + ", ".join(fp[1]) + "}"
    if mp_queues.is_queue_fp(fp):
        return mp_queues.shown(fp)
    if isinstance(fp, tuple) and len(fp) == 2 and fp[0] == "SimpleQueue":
        return f"SimpleQueue of {fp[1]}"
    if isinstance(fp, tuple) and len(fp) == 4 and fp[0] == "ctypes":
        return f"<{fp[1]}, contents #{fp[3] & 0xFFFF:04x}>"
    s = repr(fp)
    return s if len(s) < 40 else s[:37] + "..."
