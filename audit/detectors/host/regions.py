"""data-dependent-control: a differing region made only of CPU work on host memory is no graph's path.

A penalty row filled on the host from a Python dict (`pen = torch.zeros(V)`, then `for t, c in
self.counts.items(): pen[t] = c * alpha`) runs one more `select` + `copy_` for every new key, so the steps
dispatch different op sequences. Those ops run on the CPU on a GPU too: a graph records no kernel for them,
and a replay has no path of theirs to get wrong. What the host work produces is judged where it meets the
device (sending `pen` with `.to(D)` is the pageable-copy, and its changing value the baked-host-value). So a
region whose every extra op, in both steps, reads and writes host memory only (host data or a host factory of
the step, a tensor the target keeps on the host, what torch computed from those alone; a CPU tensor on a CUDA
scan) is not reported; a region with one device op in it still is.
"""

from __future__ import annotations

from audit.detectors.host.kept import computes_on_host, from_kept, host_data, kept_on_host

__all__ = ["host_work_only"]


def _host_op(ctx, r) -> bool:
    if r.kind == "host":
        return kept_on_host(ctx, r)
    if r.kind != "aten":
        return False
    if ctx.cuda:
        metas = r.inputs + r.outputs
        return bool(metas) and all(m.device.type == "cpu" for m in metas)
    host = host_data(ctx, r.step) | from_kept(ctx, r.step)
    if r.inputs and not computes_on_host(ctx, r):
        return False
    return bool(r.inputs or r.outputs) and all(m.sid in host for m in r.outputs)


def host_work_only(ctx, *regions) -> bool:
    """Every op of the given regions (lists of records of one step each) is CPU work on host memory."""
    recs = [r for reg in regions for r in reg]
    return bool(recs) and all(_host_op(ctx, r) for r in recs)
