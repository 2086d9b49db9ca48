"""baked-host-value inside a Python decomposition torch ships as an op (`quantized_decomposed::*`).

The PT2E reference quantization ops run Python on every call: `quantize_per_tensor.tensor(x, scale, zp, ...)`
reads its scale tensor back (`scale.item()`) and passes it on as a Python float into `x * (1.0 / scale)`. A
dynamic per-tensor scale changes every step, so a graph keeps the captured one: a baked host value, reported
at the target's call of the op. The same op given a fixed Python scale bakes nothing. Sizes, bounds and the
way the scale is made are drawn fresh."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, module_target, table, write_target

IMPORTS = "import torch.ao.quantization.fx._decomposed  # noqa: F401\nqd = torch.ops.quantized_decomposed"

SCALES = ["scale = (self.x.abs().amax() / {qmax}).clamp(min=1e-6)",
          "scale, zp = qd.choose_qparams.tensor(self.x, {qmin}, {qmax}, 1e-5, torch.int8)\n"
          "        scale = scale.float()  # choose_qparams gives float64\n        del zp"]
DYNAMIC = ["q = qd.quantize_per_tensor.tensor(self.x, scale, torch.zeros((), dtype=torch.long), {qmin}, {qmax}, torch.int8)  # SITE\n"
           "        y = q.float() * scale",
           "q = torch.round(self.x / scale).clamp({qmin}, {qmax}).to(torch.int8)\n"
           "        y = qd.dequantize_per_tensor.tensor(q, scale, torch.zeros((), dtype=torch.long), {qmin}, {qmax}, torch.int8)  # SITE"]
FIXED = "q = qd.quantize_per_tensor(self.x, {fixed}, 0, {qmin}, {qmax}, torch.int8)  # SITE\n        y = q.float() * {fixed}"


def _scan(tmp_path, kind):
    qmin, qmax = random.choice([(-128, 127), (-127, 127)])
    if kind == "dynamic":
        body = random.choice(SCALES) + "\n        " + random.choice(DYNAMIC)
    else:
        body = FIXED
    body = body.format(qmin=qmin, qmax=qmax, fixed=round(random.uniform(0.01, 0.1), 4))
    tpl = module_target(imports=IMPORTS, init="        self.lin = nn.Linear({d}, {d})",
                        prepare="        self.x.mul_(1 + i)",
                        step=f"        {body}\n        self.out.copy_(self.lin(y))\n        return self.out")
    path, site = write_target(tmp_path / "decomp.py", tpl, seed=random.randrange(2**31), d=random.choice([8, 16, 32]))
    return blocking(path), site


@pytest.mark.parametrize("kind", ["dynamic", "fixed"])
def test_a_torch_decomposition_op_bakes_its_scale(tmp_path, kind):
    bad, site = _scan(tmp_path, kind)
    if kind == "fixed":
        assert not len(bad), table(bad)
        return
    hit = at(bad, "baked-host-value", site)
    assert len(hit) == 1, table(bad)
    assert len(at(bad, "host-sync", site)) == 1, table(bad)  # the `.item()` the body makes, as before
