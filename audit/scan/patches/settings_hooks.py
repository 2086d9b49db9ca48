"""Torch's process-wide settings written in the step: the default dtype, matmul precision, deterministic
algorithms, the SDPA backends, and the flags of `torch.backends.cuda.matmul` / `cudnn` / `mkldnn`; and the
modes the step's thread runs under: grad mode and autocast (enabled, dtype, cache), per device type.

They live in torch's C++ globals, not in Python state a snapshot sees. A capture freezes the kernels
chosen under the value the capture ran with; a step that leaves a setting other than it found it (a
precision switch flipped per call, `torch.set_default_dtype` by phase) changes it on the host only, and a
replay does not. Each write in an audited step is a "setting" record at the writing line, with the value
before and after it (note `before\\x00after`); audit/detectors/settings.py compares a step's first value
with its last. A setting set and restored in the step, or set to the value it had, changes nothing.

Some settings are one value under two names: `set_float32_matmul_precision("high")` turns
`torch.backends.cuda.matmul.allow_tf32` on. A scoped helper that sets the precision, then the flag, and restores
both, writes the flag first when it already reads True, and last back to False: its first write's "before" is
not the value the step found. So every setting is also read when the step starts and when it ends
(`trace.settings_span`, per step: label -> (start, end)), and the detector compares those where it has them.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["watching"]


def _functions() -> list:
    """(owner, setter, label, getter) for the settings torch writes through a function."""
    b = torch.backends.cuda
    out = [(torch, "set_default_dtype", "torch default dtype", torch.get_default_dtype),
           (torch, "set_float32_matmul_precision", "float32 matmul precision", torch.get_float32_matmul_precision),
           (torch, "use_deterministic_algorithms", "deterministic algorithms", torch.are_deterministic_algorithms_enabled)]
    for kind in ("flash", "mem_efficient", "math", "cudnn"):
        if hasattr(b, f"enable_{kind}_sdp") and hasattr(b, f"{kind}_sdp_enabled"):
            out.append((b, f"enable_{kind}_sdp", f"{kind} SDPA backend", getattr(b, f"{kind}_sdp_enabled")))
    # grad mode (thread-local, as the step's thread runs it): no_grad, enable_grad and set_grad_enabled all
    # write it here; a `with` block or the step's @torch.no_grad() sets and restores it
    if hasattr(torch._C, "_set_grad_enabled"):
        out.append((torch._C, "_set_grad_enabled", "grad mode", torch.is_grad_enabled))
    if hasattr(torch, "set_autocast_cache_enabled") and hasattr(torch, "is_autocast_cache_enabled"):
        out.append((torch, "set_autocast_cache_enabled", "autocast cache", torch.is_autocast_cache_enabled))
    return out


def _per_device() -> list:
    """(owner, setter, label, getter(device_type)) for the autocast settings, one value per device type:
    `with torch.autocast(...)` sets and restores them; `torch.set_autocast_enabled("cuda", True)` in the
    step leaves autocast on for whatever runs after it."""
    out = []
    for setter, label, getter in (("set_autocast_enabled", "autocast enabled", "is_autocast_enabled"),
                                  ("set_autocast_dtype", "autocast dtype", "get_autocast_dtype")):
        if hasattr(torch, setter) and hasattr(torch, getter):
            out.append((torch, setter, label, getattr(torch, getter)))
    return out


def _device_type(args) -> str | None:
    """The device type a per-device setter was called for (the old one-argument form means CUDA)."""
    if args and isinstance(args[0], str):
        return args[0]
    return "cuda" if len(args) == 1 else None


def _flag_objects() -> list:
    """(object, label) whose attributes are settings: set through their class's __setattr__."""
    out = []
    for path in ("cuda.matmul", "cudnn", "mkldnn", "opt_einsum"):
        obj = torch.backends
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if obj is not None and type(obj).__module__.startswith("torch.backends"):
            out.append((obj, f"torch.backends.{path}"))
    return out


# the attributes of the flag objects read at a step's start and end (a name missing in this build is skipped)
_FLAG_NAMES = ("allow_tf32", "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction",
               "allow_fp16_accumulation", "fp32_precision", "enabled", "benchmark", "deterministic",
               "benchmark_limit", "strategy")


def _snapshot() -> dict:
    """label -> repr of every setting this module watches, as it reads now (unreadable ones left out)."""
    out = {label: _read(getter) for _, _, label, getter in _functions()}
    for _, _, label, getter in _per_device():
        for dev in ("cpu", "cuda"):
            out[f"{label} ({dev})"] = _read(lambda: getter(dev))
    for obj, label in _flag_objects():
        for name in _FLAG_NAMES:
            try:
                out[f"{label}.{name}"] = getattr(obj, name)
            except Exception:  # noqa: BLE001 - not a flag of this object or this build
                continue
    return {k: repr(v) for k, v in out.items() if v != "<unreadable>"}


def _read(getter):
    try:
        return getter()
    except Exception:  # noqa: BLE001 - a setting this build cannot read is not compared
        return "<unreadable>"


def _function_wrapper(tracer, label: str, orig, getter):
    def wrapper(*args, **kwargs):
        if tracer._step < 0 or tracer.host_depth:
            return orig(*args, **kwargs)
        before = _read(getter)
        out = orig(*args, **kwargs)
        tracer.record_event("setting", label, note=f"{before!r}\x00{_read(getter)!r}")
        return out

    wrapper.__name__ = getattr(orig, "__name__", label)
    wrapper.__wrapped__ = orig
    return wrapper


def _device_wrapper(tracer, label: str, orig, getter):
    def wrapper(*args, **kwargs):
        dev = _device_type(args)
        if tracer._step < 0 or tracer.host_depth or dev is None:
            return orig(*args, **kwargs)
        before = _read(lambda: getter(dev))
        out = orig(*args, **kwargs)
        tracer.record_event("setting", f"{label} ({dev})", note=f"{before!r}\x00{_read(lambda: getter(dev))!r}")
        return out

    wrapper.__name__ = getattr(orig, "__name__", label)
    wrapper.__wrapped__ = orig
    return wrapper


def _setattr_wrapper(tracer, obj, label: str, orig):
    def __setattr__(self, name, value):
        if self is not obj or tracer._step < 0 or tracer.host_depth or name.startswith("_"):
            return orig(self, name, value)
        before = _read(lambda: getattr(self, name))
        orig(self, name, value)
        tracer.record_event("setting", f"{label}.{name}", note=f"{before!r}\x00{_read(lambda: getattr(self, name))!r}")

    __setattr__.__wrapped__ = orig
    return __setattr__


@contextlib.contextmanager
def watching(tracer, patched, originals: dict):
    """Wraps the setters for one audited step; `originals` (id -> (original, new)) gets the functions, so
    names bound before the scan (`from torch import set_default_dtype`) are patched too."""
    with contextlib.ExitStack() as stack:
        for owner, name, label, getter, wrap in (*((*f, _function_wrapper) for f in _functions()),
                                                 *((*f, _device_wrapper) for f in _per_device())):
            orig = getattr(owner, name)
            new = wrap(tracer, label, orig, getter)
            stack.enter_context(patched(owner, name, new))
            originals[id(orig)] = (orig, new)
        for obj, label in _flag_objects():
            cls = type(obj)
            stack.enter_context(patched(cls, "__setattr__", _setattr_wrapper(tracer, obj, label, cls.__setattr__)))
        start, index = _snapshot(), len(tracer.trace.steps) - 1
        try:
            yield
        finally:
            end = _snapshot()
            tracer.trace.settings_span[index] = {k: (v, end[k]) for k, v in start.items() if k in end}
