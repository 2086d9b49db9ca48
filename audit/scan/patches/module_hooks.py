"""Which hooks torch runs at a module call of the step, and from which of the target's lines.

Torch runs a module's forward pre/post hooks, and the process-wide ones
(`register_module_forward_hook`), from the module's call. A hook that runs no torch op (a library's
profiler counting calls in its globals, an activation recorder appending shapes to a list) leaves no
op record with its frame on the stack, so a change it makes had no caller in the target. The tracer
notes, at each call of a module that carries hooks, the hooks and the stack that called the module.
"""

from __future__ import annotations

import functools

from torch.nn.modules import module as _module


def hooks_of(mod, skip) -> tuple:
    """The hook callables torch runs around this call of `mod`: its own and the process-wide ones, not
    those bound to `skip` (the tracer's own module hooks)."""
    out = ()
    for d in (_module._global_forward_pre_hooks, _module._global_forward_hooks,
              mod._forward_pre_hooks, mod._forward_hooks):
        if d:
            out += tuple(h for h in list(d.values()) if getattr(h, "__self__", None) is not skip)
    return out


def function_of(hook):
    """The Python function a hook callable runs: a function, a bound method's function, a partial's
    function, a callable object's `__call__`; None when it has no Python code."""
    for _ in range(8):
        if isinstance(hook, functools.partial):
            hook = hook.func
            continue
        fn = getattr(hook, "__func__", hook)
        if getattr(fn, "__code__", None) is not None:
            return fn
        hook = getattr(type(hook), "__call__", None)
        if hook is None:
            return None
    return None
