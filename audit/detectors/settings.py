"""cpu-side-effect: the step leaves one of torch's process-wide settings other than it found it.

The default dtype, the float32 matmul precision, deterministic algorithms, the SDPA backends, the
flags of `torch.backends.cuda.matmul`, `cudnn` and `mkldnn`, grad mode and autocast live in torch's C++ state: no Python
snapshot sees them, and a replay never writes them. The kernels a capture records are chosen under the
values of the capture; a step that flips one (a precision switch per call, the default dtype by phase)
runs other kernels, or makes tensors of another dtype, than a replay would. The writes are recorded by
audit.scan.settings_hooks; a setting set and restored within the step, or set to the value it had, is no
finding.
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
    for recs in ctx.steps:
        per: dict = defaultdict(list)
        for r in recs:
            if r.kind == "setting":
                per[r.op].append(r)
        for label, writes in per.items():
            first, last = _values(writes[0])[0], _values(writes[-1])[1]
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
