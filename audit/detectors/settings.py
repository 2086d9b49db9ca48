"""cpu-side-effect: the step leaves one of torch's process-wide settings other than it found it.

The default dtype, the float32 matmul precision, deterministic algorithms, the SDPA backends, the
flags of `torch.backends.cuda.matmul`, `cudnn` and `mkldnn`, grad mode and autocast live in torch's C++ state: no Python
snapshot sees them, and a replay never writes them. The kernels a capture records are chosen under the
values of the capture; a step that flips one (a precision switch per call, the default dtype by phase)
runs other kernels, or makes tensors of another dtype, than a replay would. The writes are recorded by
audit.scan.patches.settings_hooks; a setting set and restored within the step, or set to the value it had, is no
finding. Its value when the step started and when it ended decide that where they were read (a setting linked
to another, `allow_tf32` to the matmul precision, moves before the step's first write to it).
"""

from __future__ import annotations

from collections import defaultdict

from audit.detectors import register

FIX = ("Set it once, before warmup and capture, or set and restore it inside the step "
       "(a `with` block); one graph per value if it must change.")


def _values(r) -> tuple[str, str]:
    before, _, after = r.note.partition("\x00")
    return before, after


@register("cpu-side-effect")
def global_settings(ctx):
    """A torch setting changed by the step: replay keeps the value the capture ran with."""
    sites: dict = defaultdict(list)   # (file, line, label) -> [(record, first value, last value)]
    spans = getattr(ctx.trace, "settings_span", {})
    for i, recs in enumerate(ctx.steps):
        per: dict = defaultdict(list)
        for r in recs:
            if r.kind == "setting":
                per[r.op].append(r)
        for label, writes in per.items():
            # read at the step's start and end where it could be: a linked setting (the matmul precision turning
            # allow_tf32 on) changes a value before the step's first write to it
            first, last = spans.get(i, {}).get(label, (_values(writes[0])[0], _values(writes[-1])[1]))
            if first == last:
                continue  # set and restored in the step, or set to what it was
            r = next((w for w in reversed(writes) if _values(w)[0] != _values(w)[1]), writes[-1])
            fr = r.frame
            sites[(fr[0] if fr else "", fr[1] if fr else 0, label)].append((r, first, last))
    out = []
    for (_, _, label), hits in sites.items():
        r = hits[0][0]
        seen = " ; ".join(f"{a} -> {b}" for _, a, b in hits[:4])
        msg = f"the step changes torch's `{label}` ({seen}) and leaves it changed; a replay would not"
        out.append(ctx.finding("cpu-side-effect", r, f"set {label}", len(hits) / ctx.n_steps, msg, fix=FIX))
    return out


@register("baked-host-value")
def settings_by_step(ctx):
    """A setting set and restored in the step, to a value that changes between steps (`with torch.autocast(...,
    dtype=self.req_dtype)`): the kernels a capture records keep the capture's value on every replay."""
    spans = getattr(ctx.trace, "settings_span", {})
    seen: dict = defaultdict(dict)   # (file, line, label) -> step -> (record, value written)
    for i in ctx.complete:
        per: dict = defaultdict(list)
        for r in ctx.steps[i]:
            if r.kind == "setting":
                per[r.op].append(r)
        for label, writes in per.items():
            if label == "grad mode" or label.startswith("autocast enabled"):
                continue  # they pick which ops run, not which kernels: a divergence of the op sequence, control's
            first, last = spans.get(i, {}).get(label, (_values(writes[0])[0], _values(writes[-1])[1]))
            if first != last:
                continue  # left changed: global_settings reports it
            for w in writes:  # the value each site writes first (a `with` line also writes the restore)
                if w.frame:
                    seen[(w.frame[0], w.frame[1], label)].setdefault(i, (w, _values(w)[1]))
    out = []
    for (_, _, label), by_step in seen.items():
        values = [v for _, v in by_step.values()]
        if len(by_step) < 2 or len(set(values)) < 2:
            continue
        r = next(iter(by_step.values()))[0]
        msg = (f"the step sets torch's `{label}` to a value that changes between steps "
               f"({' -> '.join(values[:4])}) and restores it; a graph runs every replay with the kernels "
               "chosen under the captured value")
        out.append(ctx.finding("baked-host-value", r, f"set {label}", 1.0, msg,
                               fix="Fix the value for the captured step, or capture one graph per value and "
                                   "pick the graph on the host."))
    return out
