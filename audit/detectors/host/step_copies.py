"""Host copies the step makes itself (`p.detach().cpu().clone()`), as a GPU holds them.

On a GPU `.cpu()` makes new pageable host memory. diffusers' `EMAModel.store()` keeps
`[p.detach().cpu().clone() for p in params]` and `restore()` copies them back into the parameters
(`param.data.copy_(c)`): a pageable host-to-device copy inside the step. On a CPU scan `.cpu()` returns the tensor
itself, so its result is the device tensor's own memory; the op chained on the same line that makes new memory
from it (`.clone()`, `.float()`, `.contiguous()`) makes, on a GPU, host memory from the host copy. Those storages,
and what ops make from them alone, are host memory for the rule that looks for a copy back to the device. A bare
`.cpu()` kept as it is shares the device tensor's storage here and cannot be told from it.
"""

from __future__ import annotations

from audit.detectors.tensors.moved_home import host_copies


def made_on_host(ctx, step: int) -> dict[int, tuple]:
    """Storage id -> frame (file, line, function) of the host copy it came from, for the host memory the step's own
    host copies made (a CPU scan's view of it); computed once per step."""
    cache = ctx.__dict__.setdefault("_step_host_copies", {})
    if step in cache:
        return cache[step]
    copies, out, pending = host_copies(ctx), {}, {}  # pending: (frame, depth) -> (sids the copy read, its frame)
    for r in ctx.steps[step]:
        if not r.frame:
            continue
        key = (r.frame, len(r.stack))
        if id(r) in copies and r.inputs:
            pending[key] = ({m.sid for m in r.inputs}, r.frame)
            continue
        if r.kind != "aten" or r.nested or not r.inputs:
            continue
        ins = {m.sid for m in r.inputs}
        made = [m.sid for m, new in zip(r.outputs, r.new) if new]
        if key in pending and ins & pending[key][0]:  # the op chained on the copy's line
            if made:  # every output it makes (`torch.sort` makes values and indices) came from the one copy
                src = pending.pop(key)[1]
                out.update((sid, src) for sid in made)
            continue
        if made and ins <= out.keys():  # computed from host copies alone
            src = out[next(iter(ins))]
            out.update((sid, src) for sid in made)
    cache[step] = out
    return out
