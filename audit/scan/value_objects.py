"""Copy-on-write state objects: a rebind to a fresh instance equal to the old one changes nothing.

Some libraries never mutate their bookkeeping in place: every call builds a new state object from the
old one and stores it back (einx's backend registry runs `self.state, backend = self.state.get(...)` on
each operation, its `BackendRegistryState(self)` a copy with the same members). The attribute then
holds another object after every step, yet what it holds is the same: a replay that keeps the captured
object computes exactly what the eager step does. A snapshot therefore keeps, beside a user object's
identity, its contents (each attribute's fingerprint; objects it holds by identity), and two snapshots
whose objects are of one class with equal contents are no change. A rebind to an object whose contents
differ (`self.state = State(pos=self.state.pos + 1)`) stays a change.
"""

from __future__ import annotations

__all__ = ["content", "same_value"]

_MAX_ITEMS = 64  # larger objects are compared by identity only


def content(obj, items, fingerprint):
    """A comparable digest of a user object's attributes (`items`: its (name, value) pairs), fingerprinted one
    level deep (nested user objects by identity); None when it has too many to read cheaply."""
    if len(items) > _MAX_ITEMS:
        return None
    try:
        return tuple((k, fingerprint(v, 1)) for k, v in items)
    except Exception:  # noqa: BLE001 - an attribute whose reading raised: identity only
        return None


def same_value(a, b) -> bool:
    """Two fingerprints of a user object (`("obj", class, id, contents)`) of one class: the same object (a change
    of its own attributes is reported at their paths, not here), or another one with equal, known contents."""
    return (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 4 and a[0] == b[0] == "obj"
            and a[1] == b[1] and (a[2] == b[2] or (a[3] is not None and a[3] == b[3])))
