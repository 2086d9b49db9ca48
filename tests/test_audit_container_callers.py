"""The caller of a counter kept by a library object the target holds in a list or dict.

Stopping criteria and logits processors (objects, or closures a library factory made) sit in a container
(`self.criteria = [MaxLength(64)]`) and are called through a loop or comprehension variable, a lambda handed
the container (`map`, `functools.reduce`), or a subscript. The criterion's `self.n += 1` runs no
torch op, so no op stack leads back to the target: the caller is found in the target's source, at the
line that calls an element of the container (not the library line again).
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, library_hit, module_target, write_target

LIB = """
class MaxLength:
    def __init__(self, limit):
        self.limit, self.n = limit, 0

    def __call__(self, ids):
        self.n += 1  # LIBSITE
        return self.n >= self.limit

    def check(self, ids):
        return self(ids)
"""


def _caller_is_the_targets_call(tmp_path, monkeypatch, source: str, prefix: str, imports: str, init: str, call: str):
    """Installs `source` as a library, writes a target whose step runs `call` (its `# SITE` line) with `init`
    in __init__, scans it: the library's counter (`# LIBSITE`) is a cpu-side-effect with the SITE line as caller."""
    mod, lib = install_library(tmp_path, monkeypatch, source, prefix)
    tpl = module_target(imports=imports.format(mod=mod), init=f"        {init}", step=f"""\
        h = torch.tanh(self.x)
        {call}
        self.out.copy_(h)
        return self.out""")
    path, site = write_target(tmp_path / "target" / f"{prefix}_target.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    library_hit(bad, "cpu-side-effect", lib, path, site)


CALLS = {
    "genexpr": ("stop = any(c(h) for c in self.crits)  # SITE", "[MaxLength(10**6)]"),
    "for": ("for c in self.crits:  # noqa\n            stop = c(h)  # SITE", "[MaxLength(10**6)]"),
    "enumerate": ("stop = [c(h) for _, c in enumerate(self.crits)]  # SITE", "[MaxLength(10**6)]"),
    "subscript": ("stop = self.crits[0](h)  # SITE", "[MaxLength(10**6)]"),
    "dict values": ("stop = [c(h) for c in self.crits.values()]  # SITE", "dict(len=MaxLength(10**6))"),
    "method": ("stop = [c.check(h) for c in self.crits]  # SITE", "[MaxLength(10**6)]"),
    "map lambda": ("stop = any(map(lambda c: c(h), self.crits))  # SITE", "[MaxLength(10**6)]"),
}


def test_a_counter_in_a_contained_criterion_has_the_targets_call_as_caller(tmp_path, monkeypatch):
    form = random.choice(sorted(CALLS))
    call, held = CALLS[form]
    _caller_is_the_targets_call(tmp_path, monkeypatch, LIB, "crit", "from {mod} import MaxLength",
                                f"self.crits = {held}", call)


CLOSURE_LIB = """
def make_counter():
    n = 0

    def proc(h):
        nonlocal n
        n += 1  # LIBSITE
        return h

    return proc
"""

CLOSURE_CALLS = {
    "loop": ("for p in self.procs:  # noqa\n            h = p(h)  # SITE", "[make_counter()]"),
    "dict": ("h = self.procs['count'](h)  # SITE", "dict(count=make_counter())"),
    "reduce": ("h = functools.reduce(lambda s, p: p(s), self.procs, h)  # SITE", "[make_counter()]"),
}


def test_a_counting_closure_kept_in_a_container_has_the_targets_call_as_caller(tmp_path, monkeypatch):
    call, held = CLOSURE_CALLS[random.choice(sorted(CLOSURE_CALLS))]
    _caller_is_the_targets_call(tmp_path, monkeypatch, CLOSURE_LIB, "closure",
                                "import functools\nfrom {mod} import make_counter", f"self.procs = {held}", call)


CALLBACK_LIB = """
class TokenCounter:
    def __init__(self):
        self.count = 0

    def on_step(self, h):
        self.count += 1  # LIBSITE

    __call__ = on_step


def run_callback(cb, h):
    return cb(h)
"""

CALLBACKS = {  # also held as self.counter: its shortest path is not the one the step calls through
    "bound list": ("self.counter = TokenCounter()\n        self.cbs = [self.counter.on_step]",
                   "for cb in self.cbs:  # noqa\n            cb(h)  # SITE"),
    "partial dict": ("self.cbs = dict(count=functools.partial(TokenCounter().on_step))",
                     "self.cbs['count'](h)  # SITE"),
    "handed to a helper": ("self.counter = TokenCounter()", "run_callback(self.counter.on_step, h)  # SITE"),
    "object handed to a helper": ("self.counter = TokenCounter()", "run_callback(self.counter, h)  # SITE"),
}


def test_a_counter_behind_a_callback_has_the_targets_call_as_caller(tmp_path, monkeypatch):
    """A bound method in a callback list, a partial of one (the object is reachable through it alone: without
    following the partial's method the change is not seen at all), an object handed to a library helper."""
    init, call = CALLBACKS[random.choice(sorted(CALLBACKS))]
    _caller_is_the_targets_call(tmp_path, monkeypatch, CALLBACK_LIB, "callback",
                                "import functools\nfrom {mod} import TokenCounter, run_callback", init, call)


DRIVER_LIB = LIB + """

class Driver:
    def __init__(self, criteria):
        self.criteria = list(criteria)
"""

HELD = {  # the criterion on a library driver's list the target iterates; kept on the target's class
    "nested list": ("self.drv = Driver([MaxLength(10**6)])", "stop = [c(h) for c in self.drv.criteria]  # SITE"),
    "class attribute": ("type(self).crit = MaxLength(10**6)", "stop = self.crit(h)  # SITE"),
}


def test_a_counter_held_deeper_or_on_the_class_has_the_targets_call_as_caller(tmp_path, monkeypatch):
    """Without the class-held object's own class searched, its change had no source line at all."""
    init, call = HELD[random.choice(sorted(HELD))]
    _caller_is_the_targets_call(tmp_path, monkeypatch, DRIVER_LIB, "driver", "from {mod} import Driver, MaxLength",
                                init, call)


PARTIAL_LIB = """
def count_calls(state, h):
    state["n"] += 1  # LIBSITE
    return h


def count_calls_kw(h, state=None):
    state.append(1)  # LIBSITE
    return h
"""

PARTIALS = {  # a partial kept in an attribute itself and called through it, its frozen argument changed
    "positional": ("self.proc = functools.partial(count_calls, dict(n=0))", "h = self.proc(h)  # SITE"),
    "keyword": ("self.proc = functools.partial(count_calls_kw, state=[])", "h = self.proc(h)  # SITE"),
    "alias": ("self.proc = functools.partial(count_calls, dict(n=0))", "p = self.proc\n        h = p(h)  # SITE"),
}


def test_a_partial_kept_in_an_attribute_has_the_targets_call_as_caller(tmp_path, monkeypatch):
    """The partial runs no torch op and is no element of a container: without its attribute's call read as the
    call of the partial, the finding named the library line as its own caller."""
    init, call = PARTIALS[random.choice(sorted(PARTIALS))]
    src = PARTIAL_LIB if "kw" in init else PARTIAL_LIB.replace("state.append(1)  # LIBSITE", "state.append(1)")
    if "kw" in init:
        src = src.replace('state["n"] += 1  # LIBSITE', 'state["n"] += 1')
    _caller_is_the_targets_call(tmp_path, monkeypatch, src, "partial",
                                "import functools\nfrom {mod} import count_calls, count_calls_kw", init, call)


HELD_BY_LIB = """
import torch


def count_calls(state, h):
    state["n"] += 1  # AT_PARTIAL
    return h


def make_counter():
    n = 0

    def count(h):
        nonlocal n
        n += 1  # AT_CLOSURE
        return h

    return count


class Tally:
    def __init__(self):
        self.n = 0

    def on_h(self, h):
        self.n += 1  # AT_METHOD
        return h


class Layer:
    def __init__(self, post=None, hooks=None):
        self.post = post
        self.hooks = dict(hooks or {})

    def __call__(self, h):
        h = torch.tanh(h) * 0.5
        if self.post is not None:
            h = self.post(h)
        return h

    def run_hooks(self, h):
        h = h + 1.0
        for name in self.hooks:
            h = self.hooks[name](h)
        return h
"""

HELD_BY_LIB_FORMS = {  # the callable kept by a library object the target holds, called there through its attribute
    "partial": ("self.layer = Layer(post=functools.partial(count_calls, dict(n=0)))", "h = self.layer(h)  # SITE",
                "AT_PARTIAL"),
    "closure": ("self.layer = Layer(post=make_counter())", "h = self.layer(h)  # SITE", "AT_CLOSURE"),
    "partial in a dict": ("self.layer = Layer(hooks=dict(count=functools.partial(count_calls, dict(n=0))))",
                          "h = self.layer.run_hooks(h)  # SITE", "AT_PARTIAL"),
    "bound method": ("self.tally = Tally()\n        self.layer = Layer(post=self.tally.on_h)", "h = self.layer(h)  # SITE",
                     "AT_METHOD"),
}


@pytest.mark.parametrize("form", sorted(HELD_BY_LIB_FORMS))
def test_a_counting_callable_held_by_a_library_object_has_the_targets_call_as_caller(tmp_path, monkeypatch, form):
    """The library method that ran ops calls the partial, closure or bound method through the attribute holding
    it (`self.post(h)`), not by its function's name: without that name the library line was its own caller."""
    init, call, marker = HELD_BY_LIB_FORMS[form]
    _caller_is_the_targets_call(tmp_path, monkeypatch, HELD_BY_LIB.replace(marker, "LIBSITE"), "held",
                                "import functools\nfrom {mod} import Layer, Tally, count_calls, make_counter", init, call)
