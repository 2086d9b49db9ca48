"""Host data that stays on the host: a tensor lifted from Python data in the step that only host code reads.

`torch.cumsum(torch.tensor(seg_lens), 0).tolist()` (segment offsets built from the request lengths, S-LoRA /
punica style) changes value every step, yet no device op ever reads it: on a GPU it is CPU work outside any
graph, and a value it hands on (split sizes, a Python int) is reported where a device op takes it. So the
lift is no baked-host-value of its own. It is one as soon as anything made from it meets device data (an
operand of a device op, an index into a device tensor, a copy into a device buffer)."""

from __future__ import annotations

from audit.detectors._host import built_on_device, host_derived

LIFTS = ("aten.lift_fresh", "aten.lift_fresh_copy")


def stays_on_host(ctx, r) -> bool:
    """(CPU scan) r lifts host data into a tensor in host memory, and every op that reads what was computed
    from it reads only such host tensors; nothing of it is sent anywhere with `.to(...)`."""
    if ctx.cuda or r.op not in LIFTS or not r.inputs:
        return False
    recs = ctx.steps[r.step]
    sid = r.inputs[0].sid
    if sid in built_on_device(recs):
        return False
    host = host_derived(recs, {sid})
    for q in recs:
        ins = {m.sid for m in q.inputs}
        if q is r or not ins & host:
            continue
        if q.kind != "aten" and q.note == "cpu?":
            return False
        if q.kind == "aten" and not ins <= host:
            return False
    return True
