"""A library global that answers every attribute (a lazy shared-library proxy: llvmlite's `ffi.lib`, which
numba and so librosa import) is looked at, never asked.

Its class has `__slots__` and a `__getattr__` that wraps any name it is asked for, `__dict__` included, in a
callable object and loads the library to do so. The snapshot of Python state around each step read
`getattr(obj, "__dict__", {})`, got the wrapper, and the scan stopped with "object has no attribute 'items'"
in the step of any target that imported librosa. The state is read with `object.__getattribute__`: the proxy
has no `__dict__`, its slots are its state, and its `__getattr__` never runs. The step's own read is still found."""

from __future__ import annotations

import random

from site_util import at, blocking, install_library, module_target, write_target

LIB = """
import threading


class _FnWrapper:
    __slots__ = ["_lock", "_fn"]

    def __init__(self, lock, fn):
        self._lock, self._fn = lock, fn

    def __call__(self, *args):
        with self._lock:
            return self._fn(*args)


class {cls}:
    __slots__ = ["_handle", "_fntab", "_lock"]

    def __init__(self):
        self._handle, self._fntab, self._lock = None, {{}}, threading.Lock()

    def __getattr__(self, name):
        ASKED.append(name)
        if name not in self._fntab:
            self._fntab[name] = _FnWrapper(self._lock, len)
        return self._fntab[name]


ASKED = []
{glob} = {cls}()


def {fn}(x):
    return x * {scale}
"""


def test_a_proxy_answering_every_name_is_not_asked_for_its_dict(tmp_path, monkeypatch):
    cls, glob = random.choice(["_LibWrapper", "LazyDLL", "_Lib"]), random.choice(["lib", "ffi_lib", "_lib"])
    fn, scale = random.choice(["frontend", "preemph", "gain"]), random.choice([2.0, 0.5, 1.5])
    mod, _ = install_library(tmp_path, monkeypatch, LIB.format(cls=cls, glob=glob, fn=fn, scale=scale), prefix="lazy")
    tpl = module_target(imports=f"import {mod}", init="", step=f"""        y = {mod}.{fn}(self.x)
        peak = float(y.abs().max())  # SITE
        self.out.copy_(y / (peak + 1.0))
        return self.out""")
    path, site = write_target(tmp_path / "target" / "lazyproxy.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]))
    import importlib
    lib = importlib.import_module(mod)
    bad = blocking(path, forget=mod)  # raised TargetFailed (AttributeError: ... no attribute 'items') before
    assert len(at(bad, "host-sync", site)) == 1
    assert lib.ASKED == [], lib.ASKED  # the scan never ran the proxy's __getattr__
