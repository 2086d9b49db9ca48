"""`scan`: run a target's decode steps once under the tracer, then let every detector read the trace.

warmup steps run plain (lazy init, first-call effects, caches filling up); the following `steps`
run audited. Detectors never re-run the model. If the target raises, what was traced so far is
still turned into an inventory, attached to the TargetFailed error.
"""

from __future__ import annotations

import contextlib
import gc
import platform
import sys
import time
from collections.abc import Callable

import torch

from audit import detectors
from audit.errors import AuditError, TargetFailed
from audit.report.inventory import SEVERITIES, Inventory
from audit.target import TARGET_PREFIX, describe_error, resolve
from audit.scan.patches import hooks, host_sends
from audit.scan.sources import compiled_frames
from audit.scan.standins import cpu_cuda, pinned
from audit.scan.tracer import Tracer

__all__ = ["scan"]

Progress = Callable[[int, int, str], None]  # (iterations done, total, "warmup" | "audit")


def _check(device: str, steps: int, warmup: int) -> str:
    if not isinstance(steps, int) or steps < 2:
        raise AuditError(f"--steps must be an integer >= 2 (the cross-step detectors compare steps), not {steps!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise AuditError(f"--warmup must be an integer >= 0, not {warmup!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise AuditError(f"--device {device!r}: expected cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise AuditError(f"--device {device!r}: the audit runs on cpu or cuda")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise AuditError("--device cuda requested but CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise AuditError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    return str(dev)


def scan(target, device: str = "cpu", steps: int = 4, warmup: int = 2, path: str = "reference", *,
         progress: Progress | None = None, gpu_trace: bool = False, tp: int = 1,
         options: dict | None = None) -> Inventory:
    """Audits `target` (a factory, 'file.py:factory', 'pkg.module:factory', 'hf:DIR' or
    'dsv4:<preset>') and returns its Inventory.

    options: cache ('dynamic' | 'static', hf: targets), batch and prompt_len (hf: and dsv4:), seed.

    gpu_trace: also register torch.cuda._gpu_trace sync callbacks (CUDA only). They cannot be
    removed again, so only a process that will not capture afterwards should ask for them.
    tp: shard a dsv4 target over the default process group (this process scans its own rank;
    audit/ranks.py tags and merges the ranks' inventories)."""
    device = _check(device, steps, warmup)
    t_start = time.perf_counter()
    options = {k: v for k, v in (options or {}).items() if v is not None}
    options.setdefault("max_new_tokens", warmup + steps + 1)  # what an hf: StaticCache must hold
    pinned.forget()  # the pinned storages an earlier scan's target asked for
    host_sends.forget()  # and the host copies it made
    with _loaded_by_path():
        res = _build(target, device, path, tp, options)
        obj, total = res.obj, warmup + steps
        tracer = Tracer(obj, device, res.roots, gpu_trace=gpu_trace)
        with _no_cyclic_gc():
            try:
                with compiled_frames.unfused_scripts():  # the scan runs scripts op by op
                    failure = _run_steps(obj, tracer, res.label, warmup, total, progress)
            finally:
                tracer.close()  # the detectors below only read the trace
            findings = detectors.run(tracer.trace, obj, cuda=tracer.cuda)
    tr = tracer.trace
    meta = {
        "target": res.label, "path": path, "device": device, "warmup": warmup, "steps": steps,
        "audited_steps": len(tr.complete_steps()), "traced_ops": tr.n_ops,
        "traced_seconds": round(tr.seconds, 3),
        "ops_per_second": round(tr.n_ops / tr.seconds, 1) if tr.seconds else 0.0,
        "scan_seconds": round(time.perf_counter() - t_start, 3),
        "torch": torch.__version__, "python": platform.python_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "name": res.name, "error": failure,
    }
    shown = {k: v for k, v in options.items() if k in ("cache", "batch", "prompt_len", "seed")}
    if shown:
        meta["options"] = shown
    if tp > 1:
        meta["tp"] = tp
    inv = Inventory.from_findings(findings, meta)
    inv.meta["findings"] = {s: int((inv.df.severity == s).sum()) for s in SEVERITIES} if len(inv) else \
        {s: 0 for s in SEVERITIES}
    if failure:
        raise TargetFailed(failure, inv)
    return inv


@contextlib.contextmanager
def _no_cyclic_gc():
    """Python's cyclic collector off while the steps are traced and the detectors read the trace, back as it was
    after. A full pass visits every object of the process (torch, transformers, the target's model: millions),
    and the trace (~10 tracked objects per op), snapshots and parsed sources a scan makes set off several: with
    it on, the passes cost more than the tracing. Nothing here needs it (the
    trace is acyclic; what is left in cycles is collected after). Building the target keeps it: loading weights
    may leave large cycles behind."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextlib.contextmanager
def _loaded_by_path():
    """The target modules loaded from files (`_audit_target_*`) and the folders put on sys.path for their sibling
    imports are taken out again when the block ends: a process that scans many files (a test suite, a notebook)
    would otherwise keep every target module, and every import would search every target's folder."""
    path, names = list(sys.path), {n for n in sys.modules if n.startswith(TARGET_PREFIX)}
    try:
        yield
    finally:
        added = [d for d in sys.path if d not in path]
        for d in added:
            sys.path.remove(d)
        for n in [n for n in sys.modules if n.startswith(TARGET_PREFIX) and n not in names]:
            sys.modules.pop(n, None)


def _build(target, device: str, path: str, tp: int, options: dict | None = None):
    """resolve(), except that a factory needing CUDA on a machine without it is told where to go."""
    try:
        with cpu_cuda.outside_steps(device != "cpu"):
            return resolve(target, device, path, tp=tp, options=options)
    except AuditError as e:
        if not torch.cuda.is_available() and cpu_cuda.needs_gpu(str(e)):
            raise AuditError(f"{e}: this target needs CUDA to be built; scan it on a machine with a GPU "
                             "(--device cuda)") from None
        raise


def _default_device_set() -> bool:
    """torch.set_default_device(...) in force (for any device: the target set it from its device argument,
    so on the GPU its factories naming no device land there)."""
    return getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None) is not None


def _run_steps(obj, tracer: Tracer, label: str, warmup: int, total: int, progress: Progress | None) -> str | None:
    """prepare(i); step() for every iteration, the last `total - warmup` audited; the failure, if any."""
    for i in range(total):
        audited = i >= warmup
        stage = "prepare"
        try:
            with cpu_cuda.outside_steps(tracer.cuda):
                obj.prepare(i)
            stage = "step"
            if audited:
                tracer.trace.default_device |= _default_device_set()
                with tracer.step(i - warmup):
                    tracer.call(obj.step)
            else:
                with hooks.unaudited(tracer):
                    obj.step()
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the target failed (or called exit): keep what we have
            return (f"target {label}: {stage}() raised in {'audited' if audited else 'warmup'} "
                    f"iteration {i}: {describe_error(e)}")
        if progress:
            progress(i + 1, total, "audit" if audited else "warmup")
    return None
