"""Watching module calls during a step: what to capture for a module, and which module raised.

Decode code does not always go through `module(...)`: dsv4's Block calls `self.attn.decode(x, pos)`,
a static decoder may call helper methods. A forward pre-hook would miss those, so `CallWatch`
wraps every public method a module's own classes define (plus `forward`) as instance attributes,
for the duration of one `with` block, and removes them on exit (also on error).

It records three things:
- the outermost calls of one target module, with their arguments cloned at call time (what
  `module.method(*static_args)` must replay under capture);
- which modules ran at all (bisection only descends into children that ran);
- the innermost module running when an exception went through (`raised_in`): a capture error
  names no op, but it is raised synchronously inside the op that broke the capture.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
from torch import nn

from audit.capture.state import clone_tree

__all__ = ["Call", "CallWatch", "module_methods"]


@dataclass
class Call:
    method: str
    args: tuple
    kwargs: dict
    grad: bool = False
    inference: bool = False


def _torch_class(cls) -> bool:
    return (cls.__module__ or "").split(".")[0] == "torch" or cls is object


def module_methods(module: nn.Module) -> list[str]:
    """Public plain methods the module's own (non-torch) classes define, plus `forward`."""
    names = ["forward"] if callable(getattr(type(module), "forward", None)) else []
    for cls in type(module).__mro__:
        if _torch_class(cls):
            continue
        for name, attr in vars(cls).items():
            if name.startswith("_") or name in names or not inspect.isfunction(attr):
                continue
            names.append(name)
    return names


class CallWatch:
    """`with CallWatch({path: module}, record=module):` wraps, runs, unwraps.

    A module reachable under two paths is watched once, under the first path given.
    """

    def __init__(self, modules: dict, record: nn.Module | None = None):
        self.paths: dict[int, str] = {}
        self.modules: list[nn.Module] = []
        for path, mod in modules.items():
            if id(mod) not in self.paths:
                self.paths[id(mod)] = path
                self.modules.append(mod)
        self.record = record
        self.calls: list[Call] = []            # outermost calls of `record`
        self.called: dict[int, int] = {}       # id(module) -> number of outermost calls
        self.callers: dict[int, set] = {}      # id(module) -> ids of the modules whose code called it
        self.raised_in: str | None = None
        self._exc = None
        self._depth: dict[int, int] = {}
        self._stack: list[int] = []
        self._installed: list = []

    def __enter__(self) -> "CallWatch":
        try:
            for mod in self.modules:
                for name in module_methods(mod):
                    self._wrap(mod, name)
        except BaseException:
            self._unwrap()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._unwrap()

    def ran(self, mod: nn.Module) -> bool:
        return self.called.get(id(mod), 0) > 0

    def called_by(self, mod: nn.Module) -> list[tuple[str, nn.Module]]:
        """(path, module) of watched modules that `mod`'s own code called directly."""
        return [(self.paths[id(m)], m) for m in self.modules if id(mod) in self.callers.get(id(m), ())]

    def _wrap(self, mod: nn.Module, name: str) -> None:
        had = name in mod.__dict__
        old = mod.__dict__.get(name)
        bound = getattr(mod, name)
        if not callable(bound) or getattr(bound, "_callwatch", False):
            return
        watch, key, path = self, id(mod), self.paths[id(mod)]
        record = mod is self.record

        @functools.wraps(bound)
        def wrapper(*args, **kwargs):
            depth = watch._depth.get(key, 0)
            if depth == 0:
                watch.called[key] = watch.called.get(key, 0) + 1
                watch.callers.setdefault(key, set()).add(watch._stack[-1] if watch._stack else None)
                if record:
                    watch.calls.append(Call(name, clone_tree(args), clone_tree(kwargs), torch.is_grad_enabled(),
                                            torch.is_inference_mode_enabled()))
            watch._depth[key] = depth + 1
            watch._stack.append(key)
            try:
                return bound(*args, **kwargs)
            except BaseException as e:
                if watch._exc is not e:  # the innermost wrapper sees it first
                    watch._exc, watch.raised_in = e, path
                raise
            finally:
                watch._stack.pop()
                watch._depth[key] = depth

        wrapper._callwatch = True
        mod.__dict__[name] = wrapper
        self._installed.append((mod, name, had, old))

    def _unwrap(self) -> None:
        while self._installed:
            mod, name, had, old = self._installed.pop()
            if had:
                mod.__dict__[name] = old
            else:
                mod.__dict__.pop(name, None)

    def raised_in_chain(self, exc: BaseException) -> str | None:
        """raised_in, if the exception it saw is `exc` or one `exc` was raised from/during."""
        seen = set()
        while exc is not None and id(exc) not in seen:
            if exc is self._exc:
                return self.raised_in
            seen.add(id(exc))
            exc = exc.__cause__ or exc.__context__
        return None
