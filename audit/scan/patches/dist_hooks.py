"""torch.distributed calls in the step that wait on the host.

A tensor collective (`all_reduce`, `all_gather_into_tensor`, `reduce_scatter_tensor`, ...) on an NCCL group
is kernels on a stream: NCCL supports graph capture, and `work.wait()` on it only orders streams. These do
wait on the host:
- the object collectives (`all_gather_object`, `broadcast_object_list`, `gather_object`,
  `scatter_object_list`, `send_object_list`, `recv_object_list`): they pickle on the host, send the bytes
  through a device tensor (a pageable copy on NCCL) and read the sizes back (`.item()`). With one rank (a
  scan) the read back may not even run, so the call itself is the wait;
- `barrier()` and `monitored_barrier()`: the host blocks until every rank arrived (on NCCL, until the
  barrier's all-reduce finished on the device);
- `work.is_completed()`: polls the collective's completion from the host, as `Event.query()` does.
Each is recorded as a host-sync at the calling line (audit.scan.patches.hooks' wrapper), with nothing recorded
inside it: its own reads are part of the one wait.

Which collective a step waits for is recorded too (`issued`, `completing`): a c10d op's `Work` is noted on its
record (`work:<id>`), and `work.wait()` (or `get_future()` / `synchronize()`, which hand the wait elsewhere, or
an `is_completed()` poll) is a `dist` record naming the same id. An async collective the step never waits for
leaves the NCCL stream unjoined where the step reads its output (audit/detectors/collective_joins.py).
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["HOST_WAITS", "JOINS", "KIND", "completing", "issued", "waits"]

_OBJECT_COLLECTIVES = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
                       "send_object_list", "recv_object_list")
_BARRIERS = ("barrier", "monitored_barrier")
HOST_WAITS = (*_OBJECT_COLLECTIVES, *_BARRIERS, "is_completed")  # the names of the calls that wait on the host
KIND = "dist"  # the record kind of a join: op "Work.<method>", note the Work's id
# Work methods after which the step's stream is (or may be) joined; a poll (`is_completed()`) is a host wait already,
# and a loop on it ends when the collective has finished
JOINS = ("wait", "get_future", "synchronize", "is_completed")


def waits() -> list:
    """(owner, name, label) for the host waits of torch.distributed present in this build."""
    try:
        import torch.distributed as dist
    except ImportError:
        return []
    if not dist.is_available():
        return []
    out = []
    c10d = getattr(dist, "distributed_c10d", None)
    for name in (*_OBJECT_COLLECTIVES, *_BARRIERS):
        for owner in (dist, c10d):
            if owner is not None and callable(getattr(owner, name, None)):
                out.append((owner, name, f"torch.distributed.{name}"))
    work = getattr(dist, "Work", None)
    if isinstance(work, type) and callable(getattr(work, "is_completed", None)):
        out.append((work, "is_completed", "Work.is_completed"))
    return out


def issued(tracer, func, out) -> None:
    """A c10d op's `Work` (a TorchScript object in the dispatcher's output): noted on the op's record as
    `work:<id>` of the Python `Work` it unboxes to, the very object `dist.all_reduce(..., async_op=True)` returns
    (pybind keeps one wrapper per Work while it is alive: the list kept during the step holds it)."""
    keep = getattr(tracer, "dist_works", None)
    if keep is None or func.namespace != "c10d" or tracer._step < 0:
        return
    work = _work_class()
    for o in (out if isinstance(out, (tuple, list)) else (out,)):
        if not isinstance(o, torch.ScriptObject):
            continue
        try:
            if not o._type().qualified_name().endswith("c10d.Work"):
                continue
            w = work.unbox(o)
        except Exception:  # noqa: BLE001 - a build without Work.unbox: nothing noted
            return
        keep.append(w)
        tracer._records[-1].note = f"work:{id(w)}"
        return


@contextlib.contextmanager
def completing(tracer, patched):
    """`work.wait()` of a tensor collective runs the backend's own completion: gloo, on host tensors, copies
    the result out of its scratch tensor there (`reduce_scatter_tensor`: an `aten.split` of a tensor no op
    of the step made, then `copy_` into the output), ops NCCL never issues (its collective is one kernel).
    They are the collective's, already recorded as the c10d op: dispatched inside the wait they are nested
    (tracer.host_depth), as the reads inside a host read are, and no rule reads them as the step's ops.
    Each join the step's own code makes (not one inside a host wait) is a `dist` record naming the Work."""
    work = _work_class()
    if work is None or not callable(getattr(work, "wait", None)):
        yield
        return
    tracer.dist_works = []
    try:
        with contextlib.ExitStack() as stack:
            for name in JOINS:
                if callable(getattr(work, name, None)):
                    stack.enter_context(patched(work, name, _joining(tracer, name, getattr(work, name))))
            yield
    finally:
        tracer.dist_works = None


def _joining(tracer, name: str, orig):
    def join(self, *args, **kwargs):
        if tracer._step < 0:
            return orig(self, *args, **kwargs)
        if tracer.host_depth == 0:
            tracer.record_event(KIND, f"Work.{name}", note=f"work:{id(self)}")
        if name != "wait":
            return orig(self, *args, **kwargs)
        tracer.host_depth += 1
        try:
            return orig(self, *args, **kwargs)
        finally:
            tracer.host_depth -= 1

    join.__wrapped__ = orig
    return join


def _work_class():
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    work = getattr(dist, "Work", None) if dist.is_available() else None
    return work if isinstance(work, type) else None
