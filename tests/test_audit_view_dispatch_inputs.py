"""Inner tensors a subclass's view-only dispatch hands back are still the step's inputs.

A quantized weight's `t` (or `detach`) dispatch only rewraps: the new wrapper holds the weight's own data and
scale tensors. The tracer counted every inner tensor of an op's wrapper output as made by that op (right for
DTensor, whose ops make new local tensors), so the persistent scale looked produced in the step, and a scale
swapped in prepare() (`w.scale = self.bank[i % 3]`, a per-request adapter scale) read by the dequantizing `mm`
was never a stale input pointer. An inner tensor the op was handed is not made there: the finding is at the
library line that reads it, with the target's call as caller; refilling the scale with copy_ is clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, module_target, qweight_head, write_target

LIB = qweight_head("  # LIBSITE") + """
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func in (aten.t.default, aten.{view}.default):
            w = args[0]
            return QWeight(w.q, w.scale, {flip})
        if func is aten.mm.default:
            return args[0] @ args[1].dequantize()
        args = [a.dequantize() if isinstance(a, QWeight) else a for a in args]
        return func(*args, **(kwargs or {{}}))
"""


@pytest.mark.parametrize("view", ["t", "detach"])
@pytest.mark.parametrize("kind", ["swap", "copy"])
def test_scale_swapped_under_a_view_dispatch(tmp_path, monkeypatch, kind, view):
    src = LIB.format(view="alias" if view == "t" else "detach",
                     flip="not w.transposed if func is aten.t.default else w.transposed")
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="vw")
    use = "self.w.t()" if view == "t" else "self.w.detach().t()"
    refill = "self.w.scale = self.bank[i % 3]" if kind == "swap" else "self.w.scale.copy_(self.bank[i % 3])"
    tpl = module_target(
        imports=f"from {mod} import QWeight",
        init="""        w = torch.randn({d}, {d})
        s = w.abs().amax(1) / 127
        self.w = QWeight(torch.round(w / s[:, None]).to(torch.int8), s.clone())
        self.bank = [torch.rand({d}) * 0.01 for _ in range(3)]""",
        prepare=f"        {refill}",
        step=f"        self.out.copy_(torch.mm(self.x, {use}))  # SITE\n        return self.out")
    path, site = write_target(tmp_path / "target" / "qview.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]))
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "clean" if kind == "copy" else "hit", "stale-input-pointer", lib, path, site)
