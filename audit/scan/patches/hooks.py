"""Patches that see what the dispatcher cannot; installed for one audited step, always restored.

- Host reads: on a CPU tensor `.tolist()`, `.cpu()`, `.numpy()` never dispatch, yet on a GPU each
  is a device->host copy plus a sync. We wrap the Tensor methods so a CPU scan lists them.
- Saving or pickling device tensors (`torch.save`, `pickle.dumps(t)`, which saves the storage): the storage
  is copied to the host, never dispatched.
- CUDA waits: `torch.cuda.synchronize`, `Event.synchronize/query/elapsed_time`, `Stream.synchronize/query`.
  Sync-debug mode misses the first two (docs/hazards.md), so patching is the only reliable signal.
  On a machine without CUDA they would raise: there audit.scan.standins.cpu_cuda stands in for them, in
  warmup too (`unaudited`), so a step written for the GPU still runs on a CPU scan.
- Streams and events (CUDA scans): switches and cross-stream waits (audit.scan.patches.stream_hooks).
- `nn.Module.__setattr__`: the line of a Python state change. torch's settings: audit.scan.patches.settings_hooks;
  module hooks registered in the step: audit.scan.patches.hook_registry; torch.distributed: audit.scan.patches.dist_hooks;
  an RNN's `flatten_parameters()` (a re-pack on a GPU, a no-op on CPU weights): audit.scan.patches.rnn_flatten.
- GPU only: sync-debug mode "warn", each warning recorded where Python sees it (the line that synchronized),
  and torch.cuda._gpu_trace callbacks (registered once per process: they cannot be removed; idle otherwise).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

import torch
from torch import nn

from audit.errors import AuditError
from audit.scan import hops
from audit.scan.patches import (dist_hooks, hook_registry, module_setattr, rnn_flatten, seed_hooks, settings_hooks,
                                stream_hooks, zero_copy)
from audit.scan.sources import rng_lines, torch_frames
from audit.scan.standins import cpu_cuda, type_hooks

__all__ = ["HOST_READS", "ORIG", "active", "install_gpu_trace", "is_default_generator", "is_sync_warning",
           "sync_debug_off", "sync_debug_warn", "unaudited"]

# `.to(device)` is left out on purpose: on a CPU scan `.to(self.device)` cannot be told apart from
# `.to("cpu")`; on a CUDA scan a real device->host `.to` dispatches `_to_copy` and is caught there.
HOST_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__")
ORIG = {n: getattr(torch._C.TensorBase, n) for n in HOST_READS}
_ACTIVE = None  # the Tracer of the step being audited


def _read_on_host(tr, label: str, t: torch.Tensor, call):
    """One host read of t (an event at the caller's line), then the call with reads nested in it muted."""
    tr.record_event("host", label, t)
    if tr._records and (within := torch_frames.inside(sys._getframe(2), tr._roots)):
        tr._records[-1].inside = within  # the read is torch's own work (a distribution's argument check)
    tr.host_depth += 1
    try:
        return call()
    finally:
        tr.host_depth -= 1


def _host_wrapper(name: str, orig):
    label = f"Tensor.{name}"

    def wrapper(self, *args, **kwargs):
        tr = _ACTIVE
        if tr is None or tr.host_depth or tr._step < 0 or self.device.type != tr.device.type:
            return orig(self, *args, **kwargs)
        return _read_on_host(tr, label, self, lambda: orig(self, *args, **kwargs))

    wrapper.__name__ = name
    wrapper.__wrapped__ = orig
    return wrapper


def _is_cpu(d) -> bool:
    """`d` names the CPU: a device string or object, or a tensor whose device `.to(t)` takes (`.to(v)`)."""
    d = d.device if isinstance(d, torch.Tensor) else d
    return (isinstance(d, str) and d.startswith("cpu")) or (isinstance(d, torch.device) and d.type == "cpu")


def _host_candidate(t, devices) -> bool:
    """On a CPU scan: t is a traced tensor and one of `devices` names the CPU (a copy to the host on a GPU)."""
    tr = _ACTIVE
    return (tr is not None and not tr.host_depth and tr._step >= 0 and tr.device.type == "cpu"
            and isinstance(t, torch.Tensor) and t.device.type == "cpu" and any(_is_cpu(d) for d in devices))


NON_BLOCKING = "Tensor.to(non_blocking=True)"  # the label of a non-blocking candidate (see host_sync._to_host)


def _to_wrapper(orig):
    """`Tensor.to` towards the CPU, on a CPU scan: a device->host copy on a GPU. `.to(self.device)` looks the same
    here, so it is a candidate (note "cpu?"); host_sync keeps the calls whose source names the CPU itself."""

    def to(self, *args, **kwargs):
        if _host_candidate(self, (kwargs.get("device"),) + args[:1]):
            nb = kwargs.get("non_blocking", next((a for a in args[1:3] if isinstance(a, bool)), False))
            _ACTIVE.record_event("host", NON_BLOCKING if nb else "Tensor.to", self, note="cpu?")
        return orig(self, *args, **kwargs)

    to.__wrapped__ = orig
    return to


# torch functions that copy a tensor argument to `device=`: towards the CPU, the same candidate as `.to`
AS_TENSOR = [(torch, "as_tensor"), (torch, "asarray")]


def _as_tensor_wrapper(name: str, orig):
    label = f"torch.{name}"

    def wrapper(data, *args, **kwargs):
        if _host_candidate(data, (kwargs.get("device"),) + args[1:2]):  # as_tensor(data, dtype, device)
            _ACTIVE.record_event("host", label, data, note="cpu?")
        elif (view := zero_copy.pinned_view(_ACTIVE, orig, data, args, kwargs)) is not None:
            return view  # a numpy view of a pinned buffer, wrapped without a copy: that buffer
        return orig(data, *args, **kwargs)

    wrapper.__name__ = name
    wrapper.__wrapped__ = orig
    return wrapper


def _first_tensor(obj, depth: int = 3):
    """The first tensor in obj (a tensor, or one inside nested dicts, lists and tuples), or obj itself
    when it is a storage (pickling a tensor saves its storage: `TypedStorage.__reduce__`)."""
    if isinstance(obj, (torch.Tensor, torch.TypedStorage, torch.UntypedStorage)):
        return obj
    if depth and isinstance(obj, (dict, list, tuple)):
        for v in (obj.values() if isinstance(obj, dict) else obj):
            if (t := _first_tensor(v, depth - 1)) is not None:
                return t
    return None


def _save_wrapper(orig):
    """`torch.save(obj, f)` in the step: every device storage in obj is copied to the host first
    (`storage.cpu()`, not dispatched), which waits for the device: a host read of obj's tensors. Saving a
    host tensor waits for nothing, but the write is host work a replay skips: recorded either way, the
    detectors tell the two apart (host-sync, cpu-side-effect)."""

    def save(obj, *args, **kwargs):
        tr = _ACTIVE
        t = _first_tensor(obj) if tr is not None and tr._step >= 0 and not tr.host_depth else None
        storage = t is not None and not isinstance(t, torch.Tensor)  # pickled: no tensor left to tell host from device
        if t is None or (storage and getattr(t, "_untyped_storage", t).device.type != tr.device.type):  # TypedStorage.device warns
            return orig(obj, *args, **kwargs)
        # a storage's own __reduce__ saves it when a tensor is pickled (`pickle.dumps(t)`)
        label = "pickle" if sys._getframe(1).f_code.co_name == "__reduce__" else "torch.save"
        return _read_on_host(tr, label, t, lambda: orig(obj, *args, **kwargs))

    save.__wrapped__ = orig
    return save


def _sync_wrapper(label: str, orig, kind: str = "sync", note=None):
    def wrapper(*args, **kwargs):
        tr = _ACTIVE
        if tr is not None and tr._step >= 0 and not tr.host_depth:
            tr.record_event(kind, label, note=note(*args, **kwargs) if note else "")
            tr.host_depth += 1
            try:
                return orig(*args, **kwargs)
            finally:
                tr.host_depth -= 1
        return orig(*args, **kwargs)

    wrapper.__name__ = getattr(orig, "__name__", label)
    wrapper.__wrapped__ = orig
    return wrapper


def _sync_targets(cuda: bool):
    """The waits to wrap; the module-level synchronize calls only where CUDA exists (else the
    stand-ins answer them), the Stream/Event methods always (a stand-in never reaches them)."""
    out = [(torch.cuda.Event, "synchronize", "Event.synchronize"),
           (torch.cuda.Event, "query", "Event.query"),
           # cudaEventElapsedTime reads both events' timestamps on the host: it fails unless the device
           # has reached them (so the step waited, or raced), and events recorded in a capture have none
           (torch.cuda.Event, "elapsed_time", "Event.elapsed_time"),
           (torch.cuda.Stream, "synchronize", "Stream.synchronize"),
           (torch.cuda.Stream, "query", "Stream.query")]
    if cuda:
        out.append((torch.cuda, "synchronize", "torch.cuda.synchronize"))
        # empty_cache frees cached blocks: it waits on their pending events and cudaFree synchronizes
        # the device (a wait like synchronize; not allowed while capturing)
        out.append((torch.cuda, "empty_cache", "torch.cuda.empty_cache"))
        acc = getattr(torch, "accelerator", None)
        if acc is not None and hasattr(acc, "synchronize"):
            out.append((acc, "synchronize", "torch.accelerator.synchronize"))
    return out


@contextlib.contextmanager
def patched(owner, name: str, new):
    """Sets owner.name = new; afterwards restores exactly what was there (own attr or inherited)."""
    had = name in vars(owner)
    old = vars(owner).get(name)
    setattr(owner, name, new)
    try:
        yield
    finally:
        if had:
            setattr(owner, name, old)
        else:
            delattr(owner, name)


@contextlib.contextmanager
def active(tracer):
    """Installs every patch for `tracer`'s step; removes them in reverse order, also on error."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise AuditError("a scan is already running in this process (scans do not nest)")
    with contextlib.ExitStack() as stack:
        originals = {}  # id(original) -> (original, wrapper): aliases bound at import get the wrapper too
        for name in HOST_READS:
            orig = getattr(torch.Tensor, name)
            stack.enter_context(patched(torch.Tensor, name, _host_wrapper(name, orig)))
            originals[id(orig)] = (orig, getattr(torch.Tensor, name))  # `_tolist = torch.Tensor.tolist`
        stack.enter_context(type_hooks.patch_to(patched, _to_wrapper, lambda: _ACTIVE))  # .to, .type(<CPU type>)
        for owner, name in AS_TENSOR:
            orig = getattr(owner, name)
            stack.enter_context(patched(owner, name, _as_tensor_wrapper(name, orig)))
            originals.setdefault(id(orig), (orig, getattr(owner, name)))  # `from torch import as_tensor`
        for owner in (torch, torch.serialization):
            orig = owner.save
            stack.enter_context(patched(owner, "save", _save_wrapper(orig)))
            originals.setdefault(id(orig), (orig, owner.save))  # `from torch import save`
        stack.enter_context(zero_copy.watching(patched, originals, lambda: _ACTIVE))  # frombuffer, from_dlpack
        for owner, name, label in seed_hooks.SEEDERS:  # reseeding in the step, with the seed passed
            stack.enter_context(patched(owner, name, _sync_wrapper(label, getattr(owner, name), "seed",
                                                                   seed_hooks.seed_note(label))))
        # a CPU scan stands in on a machine with CUDA too (what CI's CPU-only machines see), as does a CUDA tracer on
        # a torch without CUDA (the tests' plumbing checks)
        have_cuda = tracer.cuda and torch.cuda.is_available()
        for owner, name, label in (*_sync_targets(have_cuda), *dist_hooks.waits()):  # dist: barrier, *_object
            orig = getattr(owner, name)
            stack.enter_context(patched(owner, name, _sync_wrapper(label, orig)))
            if not isinstance(owner, type):
                originals[id(orig)] = (orig, getattr(owner, name))
        stack.enter_context(settings_hooks.watching(tracer, patched, originals))  # torch's global settings
        stack.enter_context(hook_registry.watching(tracer, patched))  # module hooks registered in the step
        stack.enter_context(rnn_flatten.watching(tracer, patched))  # an RNN's weights re-packed in the step
        stack.enter_context(dist_hooks.completing(tracer, patched))  # a collective's own ops inside work.wait()
        for mod, name, new in cpu_cuda.alias_sites(originals):
            stack.enter_context(patched(mod, name, new))
        if not have_cuda:  # a CPU scan: stand-ins that record instead of raising
            stack.enter_context(cpu_cuda.standing_in(tracer, patched))
        if tracer.cuda:
            stack.enter_context(stream_hooks.watching(tracer, patched))
        setattr_hook = module_setattr.wrapper(nn.Module.__setattr__, lambda: _ACTIVE)
        stack.enter_context(patched(nn.Module, "__setattr__", setattr_hook))
        stack.enter_context(hops.eager_compiled())  # compiled code runs its source under the tracer
        stack.enter_context(rng_lines.recording(tracer))  # which drawing statements ran (host generators)
        _ACTIVE = tracer
        try:
            yield
        finally:
            _ACTIVE = None


@contextlib.contextmanager
def unaudited(tracer):
    """Around warmup steps: nothing is recorded, but on a CPU scan the stand-ins keep a step written for the
    GPU from raising. Warmup syncs give no finding: warmup exists for first-call
    work (compiling, allocating, a one-time synchronize), which a capture after it never sees."""
    if tracer.cuda and torch.cuda.is_available():
        yield
        return
    with cpu_cuda.standing_in(tracer, patched):
        yield


def is_default_generator(g) -> bool:
    if g is torch.default_generator:
        return True
    with contextlib.suppress(Exception):
        return any(g is d for d in torch.cuda.default_generators)
    return False


def is_sync_warning(text: str) -> bool:
    # torch announces the mode itself once ("... is a prototype feature ..."): not a sync
    return "synchroniz" in text.lower() and "prototype feature" not in text


@contextlib.contextmanager
def sync_debug_warn():
    """torch.cuda.set_sync_debug_mode('warn') for the step (process-global; restored after).

    Each sync warning becomes a 'sync' event when Python sees it: torch hands a C++ warning to
    Python as the C++ call that raised it returns, so the frame running then is the line that
    synchronized (a warning kept until the next op would blame the line after). Other warnings
    go on to whatever recorded them before."""
    tr = _ACTIVE
    prev_show = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if tr is not None and is_sync_warning(text):
            if tr._step >= 0 and not tr.host_depth:
                depth = _caller_depth(sys._getframe(1))
                where = "in" if depth else "after"  # inside the op's dispatch (not recorded yet) or after it
                tr.record_event("sync", "sync-debug", note=f"sync-debug\x00{where}\x00" + text.strip().splitlines()[0],
                                depth=depth + 2)
            return
        if prev_show is not warnings._showwarning_orig:
            prev_show(message, category, filename, lineno, file, line)
        else:  # catch_warnings(record=True) or the default: its own sink
            warnings._showwarnmsg_impl(warnings.WarningMessage(message, category, filename, lineno, file, line))

    old = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = prev_show
        torch.cuda.set_sync_debug_mode(old)


_SCAN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # audit/scan: the tracer's folder


def _caller_depth(frame) -> int:
    """Frames from `frame` to where the synchronizing call was made: when the warning surfaces inside
    the tracer's dispatch (before the op is recorded), the op's caller, not the code under the op."""
    depth, f = 0, frame
    while f is not None:
        code = f.f_code
        if code.co_name == "__torch_dispatch__" and code.co_filename.startswith(_SCAN_DIR):
            return depth + 1
        f, depth = f.f_back, depth + 1
    return 0


@contextlib.contextmanager
def sync_debug_off():
    """The audit's own device reads must not show up as the program's sync warnings."""
    old = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(0)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(old)


_GPU_TRACE_INSTALLED = False


def install_gpu_trace() -> None:
    """Registers the _gpu_trace sync callbacks once per process (they cannot be removed; docs/hazards.md
    says one fired during a later capture and failed it: only call this in a scan process)."""
    global _GPU_TRACE_INSTALLED
    if _GPU_TRACE_INSTALLED:
        return
    from torch.cuda import _gpu_trace

    torch._C._activate_gpu_trace()
    _gpu_trace.register_callback_for_device_synchronization(lambda *a: _gpu_sync("device synchronization"))
    _gpu_trace.register_callback_for_stream_synchronization(lambda *a: _gpu_sync("stream synchronization"))
    _gpu_trace.register_callback_for_event_synchronization(lambda *a: _gpu_sync("event synchronization"))
    _GPU_TRACE_INSTALLED = True


def _gpu_sync(what: str) -> None:
    tr = _ACTIVE
    if tr is not None and tr._step >= 0 and not tr.host_depth:
        tr.record_event("sync", f"cuda {what}", note="gpu_trace")
