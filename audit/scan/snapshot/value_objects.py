"""Copy-on-write state objects: a rebind to a fresh instance equal to the old one changes nothing.

Some libraries never mutate their bookkeeping in place: every call builds a new state object from the
old one and stores it back (einx's backend registry runs `self.state, backend = self.state.get(...)` on
each operation, its `BackendRegistryState(self)` a copy with the same members). The attribute then
holds another object after every step, yet what it holds is the same: a replay that keeps the captured
object computes exactly what the eager step does. A snapshot therefore keeps, beside a user object's
identity, its contents (each attribute's fingerprint; objects it holds by identity), and two snapshots
whose objects are of one class with equal contents are no change. A rebind to an object whose contents
differ (`self.state = State(pos=self.state.pos + 1)`) stays a change.

A rebind to an object whose contents differ only in which tensors it holds (a frozen dataclass state handed
back as `dataclasses.replace(st, pos=st.pos + 1)`, a NamedTuple-like record rebuilt around a new tensor) is
described by those contents, not by the object's identity (`plain_pair`): the change is then the same as a
container slot rebound to another tensor, which the tensor detectors judge (an escaping allocation is
step-allocation's; a tensor rewritten every step and never read back is no hazard).
"""

from __future__ import annotations

__all__ = ["plain", "plain_pair", "same_value", "snapshot"]

_MAX_ITEMS = 64  # larger objects are compared by identity only


def snapshot(obj, items, fingerprint) -> tuple:
    """("obj", class, identity, contents, fingerprint): `items` are its (name, value) pairs, fingerprinted one level
    deep (nested user objects by identity), None when there are too many to read cheaply; `fingerprint(obj)` is
    what the object's own state says (a host RNG's position, a queue's length), compared when it is not rebound."""
    contents = None
    if len(items) <= _MAX_ITEMS:
        try:
            contents = tuple((k, fingerprint(v, 1)) for k, v in items)
        except Exception:  # noqa: BLE001 - an attribute whose reading raised: identity only
            contents = None
    return ("obj", type(obj).__name__, id(obj), contents, fingerprint(obj))


def same_value(a, b) -> bool:
    """Two snapshots of an attribute holding a user object that are no change: the same object whose own
    fingerprint held (a change of its attributes is reported at their paths, not here), or another object of
    the same class with equal, known contents (a copy-on-write rebind)."""
    if not (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 5 and a[0] == b[0] == "obj"
            and a[1] == b[1]):
        return False
    if a[2] == b[2]:
        return a[4] == b[4]
    return a[3] is not None and a[3] == b[3]


def plain(v):
    """The object's own fingerprint for a snapshot made here (what a reported change describes), else `v`."""
    return v[4] if isinstance(v, tuple) and len(v) == 5 and v[0] == "obj" else v


def _blank(fp):
    """A fingerprint with its tensors' identities blanked (what stays when only the tensors held are swapped)."""
    if isinstance(fp, tuple) and len(fp) == 2 and fp[0] == "tensor":
        return "<tensor>"
    return tuple(_blank(x) for x in fp) if isinstance(fp, tuple) else fp


def plain_pair(a, b) -> tuple:
    """`plain` of two snapshots of one attribute; when they are two objects of one class whose known contents
    differ only in the tensors they hold, ("obj", class, contents) for each, so the change reads as a slot
    rebound to another tensor (its tensors' storages visible to the allocation rules)."""
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 5 and a[0] == b[0] == "obj" \
            and a[1] == b[1] and a[2] != b[2] and a[3] is not None and b[3] is not None and a[3] != b[3] \
            and _blank(a[3]) == _blank(b[3]):
        return ("obj", a[1], a[3]), ("obj", b[1], b[3])
    return plain(a), plain(b)
