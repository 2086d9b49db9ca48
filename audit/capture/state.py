"""Program state for trial captures: snapshot/restore, static input buffers, bitwise comparison.

Eager and replay must start from the same state or the comparison means nothing: a decode step
mutates caches in place and bumps Python counters. `Snapshot` records every non-parameter tensor
(by value) and every attribute binding, list and dict (shallowly) reachable from the roots, and
puts them back IN PLACE (`copy_`), so a captured graph keeps pointing at the same storage.
Parameters are bound, not copied: a decode step is assumed not to write its weights.

Comparison is bitwise (same kernels, same shapes: any difference is a real difference), NaNs
included: tensors are compared as integers of their width, so NaN == NaN and -0.0 != 0.0.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
from collections import deque

import torch
from torch import nn

from audit.scan.snapshot.own_dict import has_own_dict

__all__ = ["Snapshot", "clone_tree", "tensor_leaves", "RandomFeed", "compare_trees", "compare_changed",
           "bits_equal", "max_abs_diff"]

_PRIMS = (type(None), bool, int, float, complex, str, bytes)
_FOREIGN = ("torch", "builtins", "numpy", "pandas", "typing", "collections", "enum", "functools", "threading",
            "cupy", "triton", "cutlass", "cuda")
_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


_OPAQUE = (type, nn.Module, types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.ModuleType)
_MODULE_INTERNALS = {"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"}


def _user_object(v) -> bool:
    """Instances of user classes (and dataclasses) whose attributes are program state."""
    if isinstance(v, _OPAQUE) or not has_own_dict(v):
        return False
    mod = (getattr(type(v), "__module__", "") or "").split(".")[0]
    return mod not in _FOREIGN


def _storage(t: torch.Tensor) -> tuple:
    try:
        return (str(t.device), t.untyped_storage().data_ptr())
    except Exception:  # tensors without storage
        return ("", -1)


def _join(path: str, key) -> str:
    return f"{path}.{key}" if path else str(key)


class Snapshot:
    """Everything the step can change, reachable from `roots` ({name: obj} or a sequence)."""

    def __init__(self, roots, limit: int = 200_000):
        items = list(roots.items()) if isinstance(roots, dict) else [(f"state{i}", r) for i, r in enumerate(roots)]
        self.tensors: list[tuple[str, torch.Tensor, torch.Tensor]] = []   # (path, live, saved)
        self._dicts: list[tuple[dict, dict]] = []
        self._lists: list[tuple[list, list]] = []
        self._gens: list[tuple[torch.Generator, torch.Tensor]] = []
        self._cpu_rng = torch.get_rng_state()  # prepare() may draw from the global generator
        seen: set[int] = set()
        todo = deque(items)
        found: list[tuple[str, torch.Tensor]] = []
        self._param_storages: set[int] = set()
        while todo and len(seen) < limit:
            path, obj = todo.popleft()
            if id(obj) in seen or isinstance(obj, _PRIMS):
                continue
            seen.add(id(obj))
            if isinstance(obj, torch.Tensor):
                if not isinstance(obj, nn.Parameter):
                    found.append((path, obj))
                continue
            if isinstance(obj, torch.Generator):
                try:
                    self._gens.append((obj, obj.get_state()))
                except RuntimeError:
                    pass
                continue
            for key, value in self._record(obj):
                todo.append((_join(path, key), value))
        with torch.no_grad():
            for path, t in found:
                if _storage(t) in self._param_storages:
                    continue  # a view of weights (e.g. stacked expert banks): not state, never copied
                self.tensors.append((path, t, t.detach().clone()))

    def _record(self, obj):
        """Saves obj's bindings; yields (name, child) to descend into."""
        if isinstance(obj, nn.Module):
            d = obj.__dict__
            self._dicts.append((d, dict(d)))
            for name in ("_buffers", "_modules", "_parameters"):
                sub = d.get(name)
                if isinstance(sub, dict):
                    self._dicts.append((sub, dict(sub)))
                    if name != "_parameters":
                        yield from sub.items()
                    else:
                        self._param_storages.update(_storage(p) for p in sub.values() if p is not None)
            for k, v in list(d.items()):
                if k not in _MODULE_INTERNALS and "hook" not in k:
                    yield k, v
        elif isinstance(obj, (list, deque)):
            self._lists.append((obj, list(obj)))
            yield from enumerate(list(obj))
        elif isinstance(obj, tuple):
            yield from enumerate(obj)
        elif isinstance(obj, dict):
            self._dicts.append((obj, dict(obj)))
            yield from list(obj.items())
        elif _user_object(obj):
            d = vars(obj)
            self._dicts.append((d, dict(d)))
            yield from list(d.items())

    def restore(self) -> None:
        """Puts every binding and tensor value back; attributes added since are left alone."""
        for d, saved in self._dicts:
            for k, v in saved.items():
                if d.get(k, _MISSING) is not v:
                    d[k] = v
        for lst, saved in self._lists:
            if len(lst) != len(saved) or any(a is not b for a, b in zip(lst, saved)):
                lst.clear()
                lst.extend(saved)
        torch.set_rng_state(self._cpu_rng)
        for g, st in self._gens:
            g.set_state(st)
        with torch.inference_mode():
            for _, live, saved in self.tensors:
                if live.shape != saved.shape:
                    live.resize_(saved.shape)
                live.copy_(saved)

    def changed(self) -> dict[str, torch.Tensor]:
        """path -> clone of each state tensor that now differs bitwise from the snapshot."""
        out = {}
        with torch.no_grad():
            for path, live, saved in self.tensors:
                if not bits_equal(live, saved):
                    out[path] = live.detach().clone()
        return out

    def saved(self, path: str) -> torch.Tensor | None:
        for p, _, s in self.tensors:
            if p == path:
                return s
        return None

    def compare_state(self, expected: dict[str, torch.Tensor]):
        """(max abs diff, 'state PATH') of the live state against an eager record, or None."""
        worst, where = 0.0, None
        for path, live, saved in self.tensors:
            want = expected.get(path, saved)
            if not bits_equal(live, want):
                worst = max(worst, max_abs_diff(live, want))
                where = where or f"state {path}"
        return None if where is None else (worst, where)


_MISSING = object()


def compare_changed(a: dict, b: dict, snap: Snapshot):
    """Two `Snapshot.changed()` records compared (a tensor missing from one is its snapshot value)."""
    worst, where = 0.0, None
    for path in sorted(a.keys() | b.keys()):
        x, y = a.get(path), b.get(path)
        x = x if x is not None else snap.saved(path)
        y = y if y is not None else snap.saved(path)
        if x is None or y is None:
            continue
        if not bits_equal(x, y):
            worst = max(worst, max_abs_diff(x, y))
            where = where or f"state {path}"
    return None if where is None else (worst, where)


# ---------------------------------------------------------------------- static inputs
def clone_tree(x, memo: dict | None = None):
    """A copy of a nested argument structure with every tensor cloned (aliasing preserved)."""
    memo = {} if memo is None else memo
    if isinstance(x, _PRIMS):
        return x
    if id(x) in memo:
        return memo[id(x)]
    if isinstance(x, torch.Tensor):
        with torch.no_grad():
            y = x.detach().clone()
    elif isinstance(x, tuple) and hasattr(x, "_fields"):
        y = type(x)(*[clone_tree(v, memo) for v in x])
    elif isinstance(x, (list, tuple)):
        y = type(x)(clone_tree(v, memo) for v in x)
    elif isinstance(x, dict):
        y = type(x)((k, clone_tree(v, memo)) for k, v in x.items())
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        y = copy.copy(x)
        for f in dataclasses.fields(x):
            object.__setattr__(y, f.name, clone_tree(getattr(x, f.name), memo))
    else:
        y = x  # modules, opaque objects: shared, not copied
    memo[id(x)] = y
    return y


def tensor_leaves(x, out: list | None = None, seen: set | None = None) -> list[torch.Tensor]:
    """Unique tensors of a nested structure, in order."""
    out = [] if out is None else out
    seen = set() if seen is None else seen
    if isinstance(x, _PRIMS) or id(x) in seen:
        return out
    seen.add(id(x))
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            tensor_leaves(v, out, seen)
    elif isinstance(x, dict):
        for v in x.values():
            tensor_leaves(v, out, seen)
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        for f in dataclasses.fields(x):
            tensor_leaves(getattr(x, f.name), out, seen)
    return out


class RandomFeed:
    """feed(k): fresh, reproducible values for step k written into the static input tensors.

    Floats: normal noise with the recorded tensor's mean and std (non-finite entries such as -inf
    masks are kept); integers: a permutation of the recorded values (stays in range, so no index
    out of bounds); bools: unchanged. Generated on the CPU so eager and replay see the same numbers.
    """

    def __init__(self, static, seed: int = 0):
        self.seed = seed
        self.items = []
        with torch.no_grad():
            for t in tensor_leaves(static):
                if t.numel() == 0 or t.dtype == torch.bool or t.is_complex():
                    continue
                tmpl = t.detach().clone()
                if t.dtype.is_floating_point:
                    f = tmpl.float()
                    fin = torch.isfinite(f)
                    vals = f[fin]
                    mean = float(vals.mean()) if vals.numel() else 0.0
                    std = float(vals.std()) if vals.numel() > 1 else 0.0
                    std = std if std > 0 and math.isfinite(std) else 1.0
                    self.items.append((t, tmpl, fin, mean, std))
                else:
                    self.items.append((t, tmpl, None, 0.0, 0.0))

    def __call__(self, k: int) -> None:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + k + 1)
        with torch.inference_mode():  # static buffers recorded under inference mode are inference tensors
            for t, tmpl, fin, mean, std in self.items:
                if fin is not None:
                    noise = torch.randn(t.shape, generator=g) * std + mean
                    noise = noise.to(t.device)
                    t.copy_(torch.where(fin, noise, tmpl.float()).to(t.dtype))
                else:
                    perm = torch.randperm(t.numel(), generator=g).to(t.device)
                    t.copy_(tmpl.flatten()[perm].view(t.shape))


# ---------------------------------------------------------------------- comparison
def _as_bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    if t.is_complex():
        t = torch.view_as_real(t).contiguous()
    if t.dtype.is_floating_point:
        return t.view(_INT_OF_WIDTH[t.element_size()])
    return t


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.device != b.device:
        b = b.to(a.device)
    return bool(torch.equal(_as_bits(a), _as_bits(b)))


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| (inf where one side is NaN or the shapes differ; 0 for bit-only differences)."""
    if a.shape != b.shape:
        return math.inf
    if a.numel() == 0:
        return 0.0
    with torch.no_grad():
        b = b.to(a.device)
        if a.dtype == torch.bool or b.dtype == torch.bool:
            return float((a != b).any())
        if a.is_complex() or b.is_complex():
            a, b = torch.view_as_real(a.resolve_conj()), torch.view_as_real(b.resolve_conj())
        x, y = _wide(a), _wide(b)
        d = (x - y).abs()
        xn, yn = torch.isnan(x), torch.isnan(y)
        d = torch.where(xn & yn, torch.zeros_like(d), d)
        d = torch.where(xn ^ yn, torch.full_like(d, math.inf), d)
        d = torch.where(torch.isnan(d), torch.full_like(d, math.inf), d)  # inf - inf
        return float(d.max())


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.dtype.is_floating_point else t.long().double()


def compare_trees(a, b, path: str = "out"):
    """(max abs diff, first differing path) of two nested outputs, or None when bitwise equal."""
    diffs: list[tuple[float, str]] = []
    _cmp(a, b, path, diffs)
    if not diffs:
        return None
    return max(d for d, _ in diffs), diffs[0][1]


def _cmp(a, b, path: str, diffs: list) -> None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            diffs.append((math.inf, f"{path} (tensor vs {type(b if isinstance(a, torch.Tensor) else a).__name__})"))
        elif not bits_equal(a, b):
            diffs.append((max_abs_diff(a, b), path))
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            diffs.append((math.inf, f"{path} (length {len(a)} vs {len(b)})"))
        for i, (x, y) in enumerate(zip(a, b)):
            _cmp(x, y, f"{path}[{i}]", diffs)
    elif isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            diffs.append((math.inf, f"{path} (keys differ)"))
        for k in a.keys() & b.keys():
            _cmp(a[k], b[k], f"{path}[{k!r}]", diffs)
    elif dataclasses.is_dataclass(a) and type(a) is type(b) and not isinstance(a, type):
        for f in dataclasses.fields(a):
            _cmp(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}", diffs)
    else:
        try:
            same = a == b
            same = bool(same) if isinstance(same, bool) else same is True
        except Exception:
            same = a is b
        if not same:
            diffs.append((math.inf, f"{path} ({a!r} vs {b!r})"[:200]))
