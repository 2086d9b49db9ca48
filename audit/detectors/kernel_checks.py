"""host-sync inside one op's kernel on every device: a value check or a parameter the op reads back with
`.item()` below the dispatcher, so no traced op shows it (on a CPU scan nothing else marks it).

- `torch.normal` with a tensor std checks that every std is non-negative (`std.min().ge(0).item()`); a
  `torch.distributions.Normal(loc, scale).sample()` is that call. `rsample()`, `normal_` and a float std check
  nothing on the device.
- `torch.quantize_per_tensor_dynamic` picks its scale and zero point from its input's min and max, read back.
- `torch.fake_quantize_per_channel_affine` checks that every zero point lies in [quant_min, quant_max]
  (`zero_point.min()` / `.max()` read back); the per-tensor form with tensor qparams checks nothing.
"""

from __future__ import annotations

import torch

from audit.detectors.host_sync import sync_op


@sync_op("aten.quantize_per_tensor_dynamic")
def dynamic_qparams(rec):
    """quantize_per_tensor_dynamic picks scale and zero point from its input's min and max, read with `.item()`
    inside torch on every device (a float16 target is a plain cast)."""
    if torch.float16 in rec.args or ("dtype", torch.float16) in rec.args:
        return None
    return ("`quantize_per_tensor_dynamic` reads its input's min and max back to the host to pick the qparams",
            "Quantize on the device: scale = x.abs().amax(...) / 127, then round and clamp (or fake-quantize "
            "with tensor qparams).")


@sync_op("aten.normal")
def normal_std_check(rec):
    """torch.normal with a tensor std (and so `Normal(loc, scale).sample()`) checks `std.min() >= 0` with
    `.item()` inside the op, on every device; a float std or `normal_` checks nothing on the device."""
    over = getattr(rec.func, "_overloadname", "")
    std = rec.inputs[1] if over.startswith("Tensor_Tensor") else rec.inputs[0] if over.startswith("float_Tensor") \
        else None
    if std is None or not torch.Size(std.shape).numel():
        return None
    return ("`torch.normal` with a tensor std checks `std.min() >= 0` on the host (`.item()` inside the op)",
            "Sample as loc + scale * torch.randn_like(loc) (what `Normal.rsample()` does), which checks nothing.")


@sync_op("aten.fake_quantize_per_channel_affine_cachemask")
def channel_zero_points(rec):
    """fake_quantize_per_channel_affine checks `zero_point.min() >= quant_min and zero_point.max() <= quant_max`
    with `.item()` inside the op, on every device (a QAT model served with its fake-quant nodes in place)."""
    return ("`fake_quantize_per_channel_affine` reads its zero points' min and max back to the host to check their "
            "range (`.item()` inside the op)",
            "Quantize the weights once outside the step and keep them (weights do not change between steps), or "
            "fake-quantize with the arithmetic itself: `(torch.clamp(torch.round(w / s) + z, lo, hi) - z) * s`.")
