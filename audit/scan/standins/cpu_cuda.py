"""CUDA stand-ins for a scan on a machine without CUDA, so a step written for the GPU still runs.

On a CPU-only torch, torch.cuda.synchronize(), current_stream(), Stream() and Event() raise
("Torch not compiled with CUDA enabled"). While a step runs (warmup too) they are replaced by host
objects that compute nothing and report what the call would be on a GPU: waits and queries are
'sync' events (host-sync findings), stream switches and event record/wait are stream events (the
unjoined-stream rule). Outside audited steps nothing is recorded. All of it is removed on exit.
A target whose factory already needs CUDA cannot be built here: `needs_gpu` tells that error apart.
"""

from __future__ import annotations

import contextlib
import functools
import itertools

import torch
from audit.scan.patches import host_sends, stream_hooks
from audit.scan.snapshot.own_dict import own_dict
from audit.scan.standins import cpu_graphs, cpu_queries, dynamo_rules, generic_streams, pinned
from audit.scan.sources import loaded

__all__ = ["HostEvent", "HostStream", "alias_sites", "needs_gpu", "outside_steps", "standing_in"]

_CUDA_MISSING = ("torch not compiled with cuda", "requires cuda support", "dummy base class", "no nvidia driver",
                 "no cuda gpus are available", "cuda driver initialization failed", "cuda is not available",
                 "found no nvidia driver", "cannot access accelerator device",
                 "driver version is insufficient for cuda runtime",  # a CUDA build of torch, no driver
                 "no cuda-capable device is detected")  # a CUDA build and a driver, no GPU (CUDA_VISIBLE_DEVICES="")


def needs_gpu(text: str) -> bool:
    """Does this error text say that CUDA is missing on this machine?"""
    low = text.lower()
    return any(p in low for p in _CUDA_MISSING)


_IDS = itertools.count(1)  # stream ids stay unique across steps (a stream made in warmup lives on)
_STEP_IDS = itertools.count(-1, -1)  # each step's own stream: negative, another one every step


class _Host:
    """The stand-ins' shared state while installed: the tracer to report to, the current stream."""

    tracer = None
    default = None
    current = None

    def sync(self, label: str) -> None:
        tr = self.tracer
        if tr is not None and tr._step >= 0 and not tr.host_depth:
            tr.record_event("sync", label, depth=3)

    def event(self, op: str, *ids: str, stream=None) -> None:
        """A stream event; `stream`, when given, is appended as its key (None: the current one)."""
        if self.tracer is None:
            return
        if op.startswith("event."):
            ids += (stream_hooks.key(stream if stream is not None else self.current),)
        stream_hooks.note(self.tracer, op, *ids)


_HOST = _Host()


class HostStream:
    """torch.cuda.Stream on a machine without CUDA: orders nothing, reports waits and queries."""

    def __init__(self, device=None, priority: int = 0, stream_id: int | None = None, **kwargs):
        self._host = _HOST
        self.stream_id = next(_IDS) if stream_id is None else stream_id
        self.device_index = 0
        self.device = torch.device("cuda", 0)
        self.priority = priority
        self.cuda_stream = 0

    def synchronize(self) -> None:
        self._host.sync("Stream.synchronize")

    def query(self) -> bool:
        self._host.sync("Stream.query")
        return True

    def wait_event(self, event) -> None:
        event.wait(self)

    def wait_stream(self, stream) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event=None):
        event = event if event is not None else HostEvent()
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"<stand-in torch.cuda.Stream {self.stream_id} (CPU scan)>"


class HostEvent:
    """torch.cuda.Event on a machine without CUDA. Its record/wait/elapsed_time also stand in for those of
    a real torch.cuda.Event made before the step (some CPU-only builds make one lazily, in make(); record()
    and wait() raise on a stand-in stream, elapsed_time() on events never recorded; builds that raise in make()
    get a HostEvent there, see outside_steps): they use no state of their own but the event's id. A real event's query() and synchronize() run as they are (no-ops on an
    event never created), recorded by audit.scan.patches.hooks."""

    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None) -> None:
        _HOST.event("event.record", str(id(self)), stream=stream)

    def wait(self, stream=None) -> None:
        _HOST.event("event.wait", str(id(self)), stream=stream)

    def query(self) -> bool:
        _HOST.sync("Event.query")
        return True

    def synchronize(self) -> None:
        _HOST.sync("Event.synchronize")

    def elapsed_time(self, end_event) -> float:
        _HOST.sync("Event.elapsed_time")  # reads both events' device timestamps on the host
        return 0.0


_EVENT_METHODS = ("record", "wait", "elapsed_time")  # a real event's query/synchronize run (and are recorded by hooks)


def alias_sites(originals) -> list:
    """(module, global name, new) for each module global bound to a function we replace, as
    `from torch.cuda import synchronize` binds it at import: patching `torch.cuda.synchronize`
    does not reach that name, so the step would call the real function (on a CPU-only torch it
    raises; on a GPU the wait goes unrecorded). A `functools.partial` of one bound there (`_bcast =
    partial(dist.broadcast_object_list, src=0)`) holds the function the same way: it gets a partial of the
    new one. `originals` maps id(original) -> (original, new). torch's and the auditor's own modules are
    left alone."""
    if not originals:
        return []
    out = []
    if len(_ALIAS_SEEN) > 16:  # the sets of originals are few and fixed; keep no stale modules alive
        _ALIAS_SEEN.clear()
    seen = _ALIAS_SEEN.setdefault(frozenset(originals), {})
    listed, dicts = _module_globals()
    sizes = list(map(len, dicts))  # one quick pass; the loop below is most of its cost
    last = seen.get(None)
    if last is None or last[0] is not listed or last[1] != sizes:  # a module imported, or a global added
        bound = []
        for mname, mod, d in listed:
            known = seen.get(mname)
            if known is None or known[0] is not mod or known[1] != len(d):
                known = seen[mname] = (mod, len(d), _bound_originals(d, originals))
            bound += [(mod, d, name, v) for name, v in known[2]]
        last = seen[None] = (listed, sizes, bound)
    for mod, d, name, v in last[2]:
        if d.get(name) is not v:
            continue
        if isinstance(v, functools.partial):  # `_bcast = partial(dist.broadcast_object_list, src=0)`
            out.append((mod, name, functools.partial(originals[id(v.func)][1], *v.args, **v.keywords)))
        else:
            out.append((mod, name, originals[id(v)][1]))
    return out


# Walking every module's globals each step is most of a small scan's time once a large library is
# imported, so each module's bindings are remembered per set of originals until its globals change in
# number (an import adds names; our own patches rebind and restore without adding any). While no module
# was loaded and none changed in number, the last walk's bindings stand (kept under None).
_ALIAS_SEEN: dict = {}


def _module_globals() -> tuple[list, list]:
    """(name, module, globals dict) of the modules in sys.modules outside torch and the auditor, and
    their globals dicts alone."""
    def listed(items):
        out = []
        for mname, mod in items:
            d = own_dict(mod) if mod is not None else None
            if isinstance(d, dict) and mname.partition(".")[0] not in ("torch", "audit"):
                out.append((mname, mod, d))
        return out, [d for _, _, d in out]
    return loaded.until_changed("cpu_cuda.module_globals", listed)


def _bound_originals(d: dict, originals) -> list:
    """The (name, value) pairs of module globals d that hold an original, or a partial of one."""
    hits = []
    for name, v in list(d.items()):
        hit = originals.get(id(v))
        if hit is not None and hit[0] is v:
            hits.append((name, v))
        elif isinstance(v, functools.partial) and (hit := originals.get(id(v.func))) is not None \
                and hit[0] is v.func:
            hits.append((name, v))
    return hits


class _NoNVTX:
    """torch.cuda.nvtx on a CPU-only torch raises ("NVTX functions not installed"). NVTX ranges and
    marks are host-side profiler annotations, legal in a captured region and launching nothing, so
    during a CPU scan they do nothing (torch's nvtx functions all go through this object)."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: 0


def _emit_nvtx_stand_ins() -> list:
    """`with torch.autograd.profiler.emit_nvtx():` synchronizes the device on entry and exit (torch's own
    `torch.cuda.synchronize()`, a host-sync at the `with` line: the stand-in above records it) and turns on torch's
    NVTX profiler, which a CPU-only torch refuses. The ranges it emits launch nothing: here that part does nothing."""
    from torch.autograd import profiler as ap

    def enter(self):
        if not self.enabled:
            return None
        if self.entered:
            raise RuntimeError("NVTX annotation context manager is not reentrant")
        self.entered = True
        torch.cuda.synchronize()
        return self

    def exit_(self, *exc):
        if self.enabled:
            torch.cuda.synchronize()
        return False

    emit = getattr(ap, "emit_nvtx", None)
    return [] if emit is None else [(emit, "__enter__", enter), (emit, "__exit__", exit_)]


@contextlib.contextmanager
def standing_in(tracer, patched):
    """Installs the stand-ins (torch.cuda.synchronize/empty_cache/current_stream/default_stream/set_stream,
    is_current_stream_capturing, Stream(), Event(), `with torch.cuda.stream(s)`, Tensor.record_stream, CUDA graph
    capture: audit.scan.standins.cpu_graphs) for one step;
    restores torch afterwards."""
    host = _HOST
    host.tracer, host.default = tracer, HostStream(stream_id=0)
    # the step runs on a stream of its own, as under capture (a graph is captured on a side stream):
    # torch.cuda.default_stream() is then another stream than the step's, which it is in a capture,
    # so a fork from or a join to the default stream is not mistaken for a legal one. Every step gets
    # another one, as warmup and capture run on different streams: a stream the step looked up once
    # and kept (`if self.main is None: self.main = torch.cuda.current_stream()`) is not the stream a
    # later step runs on, so a fork from it or a join into it is no fork or join of that step
    host.current = HostStream(stream_id=next(_STEP_IDS))
    cuda = torch.cuda
    set0, enter0, exit0 = cuda.set_stream, cuda.StreamContext.__enter__, cuda.StreamContext.__exit__

    def switch(stream) -> None:
        host.current = stream
        host.event("stream.set", stream_hooks.key(stream))

    def set_stream(stream):
        return switch(stream) if isinstance(stream, HostStream) else set0(stream)

    def enter(self):
        if not isinstance(self.stream, HostStream):
            return enter0(self)
        host.event("stream.enter", stream_hooks.key(self.stream))
        self._audit_prev = host.current
        switch(self.stream)

    def exit_(self, *exc):
        if not isinstance(self.stream, HostStream):
            return exit0(self, *exc)
        switch(self._audit_prev)

    def sync(*args, **kwargs):
        host.sync("torch.cuda.synchronize")

    record0 = torch.Tensor.record_stream

    def record_stream(self, stream):
        # marks the tensor's memory as used by `stream` (the allocator's bookkeeping, no ordering):
        # a host tensor has no allocator to tell, and a stand-in stream is no torch.Stream
        return None if isinstance(stream, HostStream) else record0(self, stream)

    def acc_sync(*args, **kwargs):
        host.sync("torch.accelerator.synchronize")

    with contextlib.ExitStack() as stack:
        stack.enter_context(dynamo_rules.rebuilt_after())  # exits after the patches below are undone
        originals = {}
        for owner, name, new in (
                (cuda, "synchronize", sync),
                (cuda, "empty_cache", lambda: host.sync("torch.cuda.empty_cache")),
                (cuda, "current_stream", lambda device=None: host.current),
                (cuda, "default_stream", lambda device=None: host.default),
                (cuda, "set_stream", set_stream),
                (cuda.Stream, "__new__", lambda cls, *a, **k: HostStream(*a, **k)),
                (cuda.Event, "__new__", lambda cls, *a, **k: HostEvent(*a, **k)),
                (cuda.StreamContext, "__enter__", enter),
                (cuda.StreamContext, "__exit__", exit_),
                (cuda, "is_current_stream_capturing", lambda: False),  # an eager step: never capturing
                (torch.Tensor, "record_stream", record_stream),
                *((cuda.Event, m, vars(HostEvent)[m]) for m in _EVENT_METHODS),
                *cpu_graphs.stand_ins(host),  # a capture begun in the step (torch.cuda.graph, CUDAGraph)
                *pinned.step_patches(),  # `.pin_memory()`, `pin_memory=True` in the step (noted: audit.scan.standins.pinned)
                *generic_streams.stand_ins(HostStream, HostEvent),  # `torch.Stream()`: the accelerator's on a GPU
                *cpu_queries.stand_ins()):  # current_device, get_device_capability, `with torch.cuda.device(d)`, ...
            if not isinstance(owner, type):
                orig = getattr(owner, name)
                originals[id(orig)] = (orig, new)
            stack.enter_context(patched(owner, name, new))
        if hasattr(torch, "accelerator") and hasattr(torch.accelerator, "synchronize"):
            orig = torch.accelerator.synchronize
            originals[id(orig)] = (orig, acc_sync)
            stack.enter_context(patched(torch.accelerator, "synchronize", acc_sync))
        for mod, name, new in alias_sites(originals):  # `from torch.cuda import synchronize`
            stack.enter_context(patched(mod, name, new))
        nvtx = getattr(cuda, "nvtx", None)
        if nvtx is not None and type(getattr(nvtx, "_nvtx", None)).__name__ == "_NVTXStub":
            stack.enter_context(patched(nvtx, "_nvtx", _NoNVTX()))
            for owner, name, new in _emit_nvtx_stand_ins():
                stack.enter_context(patched(owner, name, new))
        stream_hooks.start(tracer, stream_hooks.key(host.current))
        try:
            yield host
        finally:
            host.tracer = host.default = host.current = None


@contextlib.contextmanager
def cpu_only_checks(tracer):
    """On a CPU scan, F.one_hot(x, num_classes=n) reads x.min() and x.max() back to check the range;
    on a GPU it leaves that to a device assert and never syncs. Those reads are not the step's
    (with num_classes=-1 the max is read on every device, and stays a finding)."""
    import torch.nn.functional as F

    orig = F.one_hot

    def one_hot(tensor, num_classes=-1):
        if num_classes == -1:
            return orig(tensor, num_classes)
        tracer.cpu_checks += 1
        try:
            return orig(tensor, num_classes)
        finally:
            tracer.cpu_checks -= 1

    one_hot.__wrapped__ = orig
    F.one_hot = one_hot
    try:
        yield
    finally:
        F.one_hot = orig


@contextlib.contextmanager
def outside_steps(gpu_scan: bool = False):
    """Around make() and prepare() of a CPU scan, on a CPU-only torch or not (on a machine with CUDA a CPU scan
    stands in the same way, so it reports what CI's CPU-only machines report). Serving code stages through pinned buffers made in
    __init__ (`torch.zeros(n, pin_memory=True)`): the CPU scan builds them in ordinary memory (audit.scan.standins.pinned
    remembers they were asked to be pinned: no pageable-copy). Timing and overlapping code makes
    its events (and streams) there: some CPU-only builds make them lazily, others raise ('Tried to instantiate
    dummy base class Event'), and those get the steps' host stand-ins (HostEvent, HostStream)."""
    if gpu_scan:
        yield
        return
    cuda, real = torch.cuda, torch.cuda.is_available()
    saved = [(cls, cls.__dict__["__new__"]) for cls in (cuda.Event, cuda.Stream) if "__new__" in cls.__dict__]
    for cls, _ in saved:
        host_cls = HostEvent if cls is cuda.Event else HostStream
        cls.__new__ = _host_new(host_cls) if real else _or_host(cls.__new__, host_cls)
    try:
        with pinned.stand_in(), host_sends.Sends(), generic_streams.outside(HostStream, HostEvent, not real):
            yield
    finally:
        for cls, new in saved:
            setattr(cls, "__new__", new)


def _host_new(host_cls):
    """A CPU scan on a machine with CUDA: a stream or event made for the step's CPU tensors is the stand-in."""
    return lambda cls, *args, **kwargs: host_cls(*args, **kwargs)


def _or_host(real, host_cls):
    def new(cls, *args, **kwargs):
        try:
            return real(cls, *args, **kwargs)
        except RuntimeError as e:
            if not needs_gpu(str(e)):
                raise
            return host_cls(*args, **kwargs)

    return new
