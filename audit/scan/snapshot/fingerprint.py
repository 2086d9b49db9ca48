"""Comparable fingerprints of plain Python values: what a state snapshot keeps of each attribute.

Containers element by element (bounded), sets by their members, arrays and ctypes values by their
bytes, C queues by their size, iterators, generators and itertools objects by their position, host random
generators by their state; tensors are the tensor detectors' business.
"""

from __future__ import annotations

import array
import ctypes
import itertools
import math
import mmap
import queue
import random
import types
from collections import OrderedDict, deque

import torch

from audit.scan.patches import mp_queues
from audit.scan.snapshot.key_text import key_text

__all__ = ["PLAIN", "PRIMS", "fp", "members"]

PRIMS = (type(None), bool, int, float, complex, str, bytes)
PLAIN = PRIMS + (list, dict, set, deque, itertools.count, array.array, bytearray,  # values a snapshot fingerprints
                 random.Random)
_MAX_ITEMS = 32  # generator locals shown in a message


def _view(t: torch.Tensor) -> tuple:
    """(storage, offset, shape, strides, dtype) of a tensor: the memory it reads and how; its id if it has
    no storage (a wrapper subclass)."""
    try:
        return (t.untyped_storage()._cdata, t.storage_offset(), tuple(t.shape), t.stride(), str(t.dtype))
    except Exception:  # noqa: BLE001 - sparse, meta, wrapper subclasses
        return (id(t),)


def fp(v, depth: int = 0):
    """_fp(v), or the object's identity where reading it raised: a snapshot must not fail the step."""
    try:
        return _fp(v, depth)
    except Exception:  # noqa: BLE001 - a library container whose own methods raise mid-step
        return ("obj", type(v).__name__, id(v))


def members(v) -> list:
    """The (key, value) pairs of a dict, the elements of a list, tuple or deque, read from the storage the
    builtin keeps: a library's subclass that overrides items() or __iter__ in Python (a lazy registry that
    imports a module per key, as an auto-class mapping does) is not run in the middle of a step, where it
    could raise, or import and register half a library."""
    base = (OrderedDict if isinstance(v, OrderedDict) else dict) if isinstance(v, dict) else \
        next(b for b in (list, tuple, deque) if isinstance(v, b))  # an OrderedDict's order is its own (move_to_end)
    name = "items" if isinstance(v, dict) else "__iter__"
    meth = getattr(type(v), name, None)
    return list(getattr(base, name)(v) if isinstance(meth, types.FunctionType) else getattr(v, name)())


def _fp(v, depth: int = 0):
    """A cheap, comparable fingerprint of a plain value; tensors are left to the tensor detectors.

    Containers are compared element by element (up to _MAX_ELEMS, nested up to _MAX_DEPTH: a
    persistent batch's 64 slots, a request dict of dicts of lists), sets by their members (a free
    list that gives one slot out and takes one back keeps its size), arrays and numpy arrays by
    their bytes, iterators and itertools objects by their position."""
    if isinstance(v, PRIMS):
        return "nan" if isinstance(v, float) and math.isnan(v) else v
    if isinstance(v, torch.Tensor):  # an attribute's tensor is the tensor detectors' business; a
        # container's member is Python state: the step that puts another tensor there (a deque window,
        # a list slot) changes what a replay would not. Kept by the memory it reads (a replay keeps the
        # captured object): a fresh view of the same rows of a pool (`slots[i] = pool[i]`) is no change.
        return "<tensor>" if depth == 0 else ("tensor", _view(v))
    if isinstance(v, (torch.dtype, torch.device, torch.Size)):
        return v
    if isinstance(v, (list, tuple, deque)):
        xs = members(v)
        if depth >= _MAX_DEPTH or len(xs) > _MAX_ELEMS:
            return (type(v).__name__, len(xs), _digest(xs))
        return (type(v).__name__, len(xs), tuple(fp(x, depth + 1) for x in xs))
    if isinstance(v, dict):
        pairs = members(v)
        if depth >= _MAX_DEPTH or len(pairs) > _MAX_ELEMS:
            return ("dict", len(pairs), _digest(pairs))
        return ("dict", len(pairs), tuple((key_text(k), fp(x, depth + 1)) for k, x in pairs))
    if isinstance(v, (set, frozenset)):
        shown = sorted(key_text(x) for x in list(v)[:_MAX_ELEMS])
        return (type(v).__name__, len(v), tuple(shown) if len(v) <= _MAX_ELEMS else hash(tuple(shown)))
    if isinstance(v, array.array):  # vLLM keeps token ids in array('l')
        return ("array", v.typecode, len(v), hash(v.tobytes()))
    if isinstance(v, (bytearray, memoryview, mmap.mmap)):  # a shared-memory header, an IPC ring written in
        # place (struct.pack_into, readinto): mutable bytes, compared by their contents
        try:
            return (type(v).__name__, len(v), hash(bytes(v)) if len(v) <= _MAX_ARRAY_BYTES else len(v))
        except (ValueError, TypeError):  # a released memoryview, a closed mmap
            return ("obj", type(v).__name__, id(v))
    if isinstance(v, _CTYPES):  # multiprocessing.Value's shared c_long (a progress counter), a ctypes struct
        try:
            raw = bytes(memoryview(v).cast("B"))
        except (TypeError, ValueError):
            return ("obj", type(v).__name__, id(v))
        return ("ctypes", type(v).__name__, len(raw), hash(raw) if len(raw) <= _MAX_ARRAY_BYTES else len(raw))
    if mp_queues.is_mp_queue(v):  # its items go to a pipe at once: the puts the step made
        return mp_queues.fingerprint(v)
    if isinstance(v, queue.SimpleQueue):  # a C queue (a token streamer's): put() changes only its size
        return ("SimpleQueue", v.qsize())
    if isinstance(v, itertools.count):  # next() on it is a step counter; its repr shows the state
        return ("obj", repr(v))
    if isinstance(v, types.GeneratorType):  # next() on it advances state held in its frame
        return ("obj", _generator_state(v))
    if (at := _iterator_position(v)) is not None:  # iter(list) / iter(range): the position is the state
        return ("obj", f"<{type(v).__name__} at {at}>")
    if type(v).__module__ == "itertools" and (state := _reduced_state(v)) is not None:  # cycle, islice...
        return ("obj", f"<itertools.{type(v).__name__} {state}>")
    if (state := _rng_state(v)) is not None:  # a draw advances a host RNG whose state lives in C
        return ("obj", f"<{type(v).__name__} state #{state & 0xFFFF:04x}>")
    if type(v).__name__ == "ndarray" and type(v).__module__ == "numpy" and v.nbytes <= _MAX_ARRAY_BYTES:
        # host state mutated in place (`lens += 1`, a block table): small arrays by value, larger ones by a hash
        # (a NaN is spelled "nan": `tolist()` makes new float objects, and nan != nan)
        return ("ndarray", v.shape, str(v.dtype), tuple([_nan_free(x) for x in v.ravel().tolist()]) if v.size <= 8
                else hash(v.tobytes()))
    return ("obj", type(v).__name__, id(v))


_CTYPES = (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array)


def _nan_free(x):
    """A number as compared across steps: every NaN alike (a real or complex NaN equals no other object)."""
    if isinstance(x, float) and x != x:
        return "nan"
    if isinstance(x, complex) and x != x:
        return ("complex", _nan_free(x.real), _nan_free(x.imag))
    return x


_MAX_DEPTH = 4
_MAX_ELEMS = 4096
_MAX_ARRAY_BYTES = 64 << 20


def _digest(items: list) -> int:
    """A hash of a container's members (members()) too many or too deep to keep one by one."""
    try:
        return hash(tuple(key_text(x) if not isinstance(x, torch.Tensor) else "<tensor>" for x in items))
    except Exception:  # noqa: BLE001 - an unhashable or unprintable member: fall back to the size
        return len(items)


def _reduced_state(v):
    """An itertools object's position, from its pickling state (cycle: the saved items and where it is)."""
    import warnings

    try:
        with warnings.catch_warnings():  # Python 3.12 deprecates pickling itertools objects
            warnings.simplefilter("ignore")
            r = v.__reduce__()
    except Exception:  # noqa: BLE001
        return None
    state = r[2] if len(r) > 2 else None
    text = repr(state)
    return text if len(text) < 2000 else hash(text)


def _rng_state(v) -> int | None:
    """A hash of a host random generator's state (`random.Random`, numpy's `Generator` / `RandomState`),
    else None: drawing from one in the step advances it, and a replay would not."""
    try:
        if isinstance(v, random.Random):
            return hash(v.getstate())
        if (type(v).__module__ or "").startswith("numpy.random"):
            bg = getattr(v, "bit_generator", None)
            return hash(_hashable(bg.state if bg is not None else v.get_state()))
    except (NotImplementedError, AttributeError, TypeError):  # SystemRandom keeps no state
        return None
    return None


def _hashable(x):
    """numpy RNG state (dicts, tuples, arrays of words) as something hash() takes, every word included."""
    if isinstance(x, dict):
        return tuple((k, _hashable(x[k])) for k in sorted(x))
    if isinstance(x, (list, tuple)):
        return tuple(_hashable(y) for y in x)
    if hasattr(x, "tobytes"):
        return x.tobytes()
    return x


_WRAPPING = (zip, enumerate, map, filter)


def _iterator_position(v, depth: int = 0):
    """The position of a builtin iterator (list, tuple, range...: its __reduce__ carries it), or the positions
    of the iterators a zip / enumerate / map / filter wraps (a sampler's `next(self.pairs)` over
    `zip(sigmas[:-1], sigmas[1:])`; enumerate's count included), else None. A range iterator reduces to the
    range still ahead on Python 3.12+ (its start is the position), a dict or set iterator to the items left."""
    wrap = type(v) in _WRAPPING
    if not wrap and (type(v).__module__ != "builtins" or not type(v).__name__.endswith("iterator")):
        return None
    try:
        r = v.__reduce__()
    except Exception:  # noqa: BLE001 - not every iterator reduces
        return None
    if not wrap:
        if len(r) > 2 and isinstance(r[2], int):
            return r[2]
        ahead = r[1] if len(r) > 1 and isinstance(r[1], tuple) and len(r[1]) == 1 else ()
        if ahead and isinstance(ahead[0], range):
            return ahead[0].start
        return f"{len(ahead[0])} left" if ahead and isinstance(ahead[0], list) else None
    inner = tuple(a if isinstance(a, int) else _iterator_position(a, depth + 1)
                  for a in (r[1] if len(r) > 1 and depth < 4 else ()) if not callable(a))
    return inner if any(x is not None for x in inner) else None


def _generator_state(g) -> str:
    """`<generator name: local=value, ...>` from the suspended frame (exhausted: `done`)."""
    fr = g.gi_frame
    if fr is None:
        return f"<generator {g.__name__}: done>"
    parts = []
    for k, x in list(fr.f_locals.items())[:_MAX_ITEMS]:
        if isinstance(x, PRIMS):
            parts.append(f"{k}={x!r}")
        elif (at := _iterator_position(x)) is not None:
            parts.append(f"{k}@{at}")
    return f"<generator {g.__name__}: {', '.join(parts)}>"


