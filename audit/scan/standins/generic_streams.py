"""torch.Stream() / torch.Event(), the device-generic stream API, on a CPU scan.

transformers' offloaded caches (`DynamicCache(offloading=True)`, `StaticCache(offloading=True)`) make
`self.prefetch_stream = torch.Stream()`, prefetch the next layer under `with self.prefetch_stream:` and join with
`torch.cuda.default_stream(device).wait_stream(self.prefetch_stream)`, also in the prefill that make() runs. On a
GPU `torch.Stream()` with no device is the accelerator's, a CUDA stream; on a CPU-only torch it is the CPU's,
which records no event ('cpu backend doesn't support events') and whose block the stream rule never sees, and
`torch.cuda.default_stream()` raises outside a step. While a CPU scan builds, prepares and runs the target,
`torch.Stream` and `torch.Event` called with no device or a CUDA one make audit.scan.standins.cpu_cuda's stand-ins
(which enter as context managers, as torch.Stream does); on a CPU-only torch, make() and prepare() also get a
stand-in `current_stream` / `default_stream`. A stream or event named for the CPU stays the CPU's.
"""

from __future__ import annotations

import contextlib

import torch

from audit.scan.patches import stream_hooks

__all__ = ["outside", "stand_ins"]


def _cuda_or_none(args, kwargs) -> bool:
    dev = kwargs.get("device", args[0] if args else None)
    if dev is None:
        return True
    try:
        return torch.device(dev).type == "cuda"
    except (TypeError, RuntimeError):
        return isinstance(dev, int)  # a device index: the accelerator's


def _entering(host_cls):
    """The stand-in stream class, entered as `with stream:` (torch.Stream's own context manager): a switch to it
    while a step runs, recorded as `with torch.cuda.stream(s):` is."""
    class Entered(host_cls):
        def __enter__(self):
            h = self._host
            if h.current is not None:
                h.event("stream.enter", stream_hooks.key(self))
                self._prev, h.current = h.current, self
                h.event("stream.set", stream_hooks.key(self))
            return self

        def __exit__(self, *exc):
            prev = self.__dict__.pop("_prev", None)
            if prev is not None and self._host.current is not None:
                self._host.current = prev
                self._host.event("stream.set", stream_hooks.key(prev))
            return False

    return Entered


def _factory(real, host_cls):
    class Factory(real):  # a subclass, so `isinstance(s, torch.Stream)` of streams made here still holds
        def __new__(cls, *args, **kwargs):
            if _cuda_or_none(args, kwargs):
                return host_cls(**{k: v for k, v in kwargs.items() if k == "priority"})
            return real(*args, **kwargs)

    Factory.__name__ = Factory.__qualname__ = real.__name__
    return Factory


def stand_ins(host_stream, host_event) -> list:
    """(owner, name, new) for `torch.Stream` and `torch.Event` (absent before torch 2.2: nothing)."""
    out = []
    for name, host_cls in (("Stream", _entering(host_stream)), ("Event", host_event)):
        real = getattr(torch, name, None)
        if isinstance(real, type):
            out.append((torch, name, _factory(real, host_cls)))
    return out


@contextlib.contextmanager
def outside(host_stream, host_event, cpu_only: bool):
    """Around make() and prepare() of a CPU scan: the generic stand-ins, and on a CPU-only torch a stand-in for
    the stream queries a prefill's stream bookkeeping makes (no tracer: nothing is recorded)."""
    patches = stand_ins(host_stream, host_event)
    if cpu_only:
        default = host_stream(stream_id=0)
        patches += [(torch.cuda, "current_stream", lambda device=None: default),
                    (torch.cuda, "default_stream", lambda device=None: default)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, new in patches:
            setattr(owner, name, new)
        yield
    finally:
        for owner, name, old in saved:
            setattr(owner, name, old)
