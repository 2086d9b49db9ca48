"""Host data the step builds and reads back on the host alone: no value a graph would bake.

`lens = torch.tensor([len(r) for r in reqs]); n = max(lens.tolist())` builds a tensor from changing Python
data, but no device op, copy or `.to(D)` ever takes it or what the host computes from it. Capture records no
kernel for it; what the host does with the Python values it reads back is judged where they go (a changing
scalar argument of a device op is baked at that op, a changed attribute is a cpu-side-effect). So the
baked-host-value rule skips such a `torch.tensor(...)`, and dynamic-shape skips it when its length changes.
"""

from __future__ import annotations

from audit.detectors import _source
from audit.detectors._host import host_derived


def stays_on_host(ctx, lifted) -> bool:
    """For the lift_fresh records of one call site (one per step): in every step, the lifted tensor and all
    that ops computed from it alone meet no other tensor in an op, and are neither sent with `.to(D)` nor
    copied into another tensor."""
    for r in lifted:
        recs = ctx.steps[r.step]
        born = host_derived(recs, {r.inputs[0].sid} if r.inputs else set())
        for q in recs:
            ins = [m.sid for m in q.inputs]
            if not any(s in born for s in ins):
                continue
            if q.kind == "host" and q.note == "cpu?" and q.stack and \
                    not _source.names_cpu(q.stack[-1][0].co_filename, q.stack[-1][1]):
                return False  # `.to(D)`: sent to the device (pageable-copy's finding, baked too)
            if q.kind == "aten" and any(s not in born for s in ins):
                return False  # meets a device tensor (or is copied into one)
            if q.kind == "aten" and q.op.endswith("_") and q.inputs and q.inputs[0].sid not in born:
                return False
    return True
