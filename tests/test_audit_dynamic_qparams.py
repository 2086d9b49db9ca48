"""host-sync inside `torch.quantize_per_tensor_dynamic` (and `torch.fake_quantize_per_channel_affine`): one op to the dispatcher, whose kernel (CPU and CUDA alike)
reads its input's min and max back with `.item()` to choose the scale and zero point. A CPU scan sees one op and
no read, so the op itself is the sync, at the line that called it. Its float16 form is a plain cast and reads
nothing. Sizes, the quantized dtype and the input's expression are drawn fresh."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, matmul_target, table, write_target


def _scan(tmp_path, dtype: str):
    expr = random.choice(["self.x", "self.x @ self.w", "torch.tanh(self.x)"])
    step = (f"        q = torch.quantize_per_tensor_dynamic({expr}, {dtype}, {random.choice([False, True])})  # SITE\n"
            "        y = q.dequantize() if q.is_quantized else q.float()\n"
            "        self.out.copy_(y)\n        return self.out")
    path, site = write_target(tmp_path / "dynq.py", matmul_target(step), seed=random.randrange(2**31),
                              d=random.choice([8, 16, 32]))
    return blocking(path), site


@pytest.mark.parametrize("dtype", ["torch.quint8", "torch.qint8"])
def test_dynamic_qparams_are_read_back(tmp_path, dtype):
    bad, site = _scan(tmp_path, dtype)
    hit = at(bad, "host-sync", site)
    assert len(hit) == 1 and hit.iloc[0].op == "aten.quantize_per_tensor_dynamic", table(bad)


def test_float16_form_is_a_cast(tmp_path):
    bad, _ = _scan(tmp_path, "torch.float16")
    assert not len(bad), table(bad)


@pytest.mark.parametrize("form", ["channel", "tensor"])
def test_fake_quant_zero_points_are_checked_per_channel_only(tmp_path, form):
    """fake_quantize_per_channel_affine checks its zero points' range with `.item()` inside the op (on a GPU the
    wait was seen by sync-debug mode); the per-tensor form with tensor qparams checks nothing."""
    d = random.choice([8, 16, 32])
    call = ("torch.fake_quantize_per_channel_affine(self.x @ self.w, self.s, self.z, 1, -128, 127)" if form == "channel"
            else "torch.fake_quantize_per_tensor_affine(self.x @ self.w, self.s[:1], self.z[:1], -128, 127)")
    step = (f"        y = {call}  # SITE\n        self.out.copy_(y)\n        return self.out")
    init = (f"        self.s = torch.rand({d}) * 0.1 + 0.01\n"
            f"        self.z = torch.randint(-4, 5, ({d},), dtype=torch.int32)")
    path, site = write_target(tmp_path / "fq.py", matmul_target(step, init=init), seed=random.randrange(2**31), d=d)
    bad = blocking(path)
    hit = at(bad, "host-sync", site)
    assert len(hit) == (1 if form == "channel" else 0), table(bad)
