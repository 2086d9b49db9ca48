"""host-sync: ops that take a 0-dim tensor where a number goes and read it on the host inside torch.

`torch.linspace(-amax, amax, n)` with a device `amax` dispatches one op, `linspace.Tensor_Tensor`, whose
C++ body calls `start.item()` and `end.item()`: the read happens below the dispatcher, where no tracer
sees a `_local_scalar_dense`, yet on a GPU it waits for the device like any `.item()`. The same holds for
`logspace`'s tensor overloads, `index_fill(dim, idx, value_tensor)` (`source.item()`) and
`quantize_per_tensor` with tensor qparams (a quantizer is built from host numbers). Scalar arguments
written as numbers, and values built from host data in the step or kept on the host, read nothing back.
CPU scans only: on a GPU, sync-debug mode reports the read at the same line (host_sync's runtime rule).
"""

from __future__ import annotations

from audit.detectors import register
from audit.detectors.host.kept import from_kept, host_data

# op -> (overloads that take a tensor where a number goes, input positions read on the host; None: every 0-dim input)
HOST_READ_ARGS: dict[str, tuple[tuple[str, ...], tuple[int, ...] | None]] = {
    "aten.linspace": (("Tensor_Tensor", "Tensor_Scalar", "Scalar_Tensor", "Tensor_Tensor_out", "Tensor_Scalar_out",
                       "Scalar_Tensor_out"), None),
    "aten.logspace": (("Tensor_Tensor", "Tensor_Scalar", "Scalar_Tensor", "Tensor_Tensor_out", "Tensor_Scalar_out",
                       "Scalar_Tensor_out"), None),
    "aten.index_fill": (("int_Tensor", "Dimname_Tensor"), (-1,)),
    "aten.index_fill_": (("int_Tensor", "Dimname_Tensor"), (-1,)),
    "aten.quantize_per_tensor": (("tensor_qparams",), (1, 2)),
}

FIX = ("Pass numbers the host already has, or compute on the device: `torch.linspace(-1, 1, n) * amax`, "
       "`x.index_fill(d, idx, 0.0)` then `torch.where`, tensor-qparam fake quantization "
       "(`torch.fake_quantize_per_tensor_affine(x, scale_t, zp_t, ...)`).")


def read_inputs(r) -> list:
    """The inputs of record `r` that its op reads on the host, or [] when its overload reads none."""
    spec = HOST_READ_ARGS.get(r.op)
    overload = getattr(r.func, "_overloadname", "")
    if spec is None or overload not in spec[0]:
        return []
    if spec[1] is None:
        return [m for m in r.inputs if tuple(m.shape) == ()]
    return [r.inputs[i] for i in spec[1] if -len(r.inputs) <= i < len(r.inputs)]


@register("host-sync")
def tensor_scalar_args(ctx):
    """(CPU scan) a 0-dim device tensor passed where the op wants a number: torch reads it with `.item()`."""
    if ctx.cuda:
        return []
    hits = []
    for r in ctx.all_records(("aten",)):
        if r.nested or r.op not in HOST_READ_ARGS:
            continue
        host = host_data(ctx, r.step) | from_kept(ctx, r.step)
        if any(m.sid not in host for m in read_inputs(r)):
            hits.append(r)
    return [ctx.finding("host-sync", g[0], op, len(g) / ctx.n_steps,
                        f"`{op}.{getattr(g[0].func, '_overloadname', '')}` takes a device tensor where a number goes "
                        "and reads it with `.item()` inside torch: on a GPU the host waits for the device",
                        fix=FIX)
            for (_, _, op, _), g in ctx.per_site(hits).items()]
