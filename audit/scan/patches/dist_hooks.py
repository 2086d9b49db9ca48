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
"""

from __future__ import annotations

import contextlib

__all__ = ["HOST_WAITS", "completing", "waits"]

_OBJECT_COLLECTIVES = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
                       "send_object_list", "recv_object_list")
_BARRIERS = ("barrier", "monitored_barrier")
HOST_WAITS = (*_OBJECT_COLLECTIVES, *_BARRIERS, "is_completed")  # the names of the calls that wait on the host


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


@contextlib.contextmanager
def completing(tracer, patched):
    """`work.wait()` of a tensor collective runs the backend's own completion: gloo, on host tensors, copies
    the result out of its scratch tensor there (`reduce_scatter_tensor`: an `aten.split` of a tensor no op
    of the step made, then `copy_` into the output), ops NCCL never issues (its collective is one kernel).
    They are the collective's, already recorded as the c10d op: dispatched inside the wait they are nested
    (tracer.host_depth), as the reads inside a host read are, and no rule reads them as the step's ops."""
    work = _work_class()
    if work is None or not callable(getattr(work, "wait", None)):
        yield
        return
    orig = work.wait

    def wait(self, *args, **kwargs):
        if tracer._step < 0:
            return orig(self, *args, **kwargs)
        tracer.host_depth += 1
        try:
            return orig(self, *args, **kwargs)
        finally:
            tracer.host_depth -= 1

    wait.__wrapped__ = orig
    with patched(work, "wait", wait):
        yield


def _work_class():
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    work = getattr(dist, "Work", None) if dist.is_available() else None
    return work if isinstance(work, type) else None
