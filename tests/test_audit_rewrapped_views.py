"""A wrapper a view-only dispatch returns allocates nothing: keeping it across steps is no escape.

A quantized linear keeps its weight's transposed view (`self._wt = self.weight.t()`, a `t` dispatch that only
rewraps the weight's own data and scales) and refreshes it after use, so each step reads the view the step
before made. The wrapper's own storage holds no memory; a replay's kernels read the persistent inner tensors.
The tracer counted the wrapper's storage as allocated at the `t`, so the next step's read was an escaped
allocation (silent-corruption), and the view, new each step and read from outside, a stale input pointer.
A wrapper made only of tensors the op was handed is no allocation, and a traced dispatch's ops, not the
wrapper, are what read memory. A dispatch that does make new inner tensors (`w * 2` scaling the scales)
kept and read by the next step is still the escape it is.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, marked_line, module_target, qweight_head, table, write_target

LIB = qweight_head() + """
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        w = args[0] if isinstance(args[0], QWeight) else None
        if func is aten.t.default:
            return QWeight(w.q, w.scale, not w.transposed)
        if func is aten.mul.Tensor and w is not None:
            return QWeight(w.q, w.scale * args[1], w.transposed)  # LIBSITE
        if func is aten.mm.default:
            return args[0] @ args[1].dequantize()
        args = [a.dequantize() if isinstance(a, QWeight) else a for a in args]
        return func(*args, **(kwargs or {}))


class Holder:
    def __init__(self, w, make):
        self.w, self.make = w, make
        self.kept = make(w)

    def __call__(self, x):
        y = torch.mm(x, self.kept)
        self.kept = self.make(self.w)
        return y
"""


@pytest.mark.parametrize("kind", ["view", "scaled"])
def test_kept_wrapper_across_steps(tmp_path, monkeypatch, kind):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="rw")
    make = "lambda w: w.t()" if kind == "view" else f"lambda w: (w * {random.choice([2.0, 0.5])}).t()"
    tpl = module_target(
        imports=f"from {mod} import QWeight, Holder",
        init=f"""        w = torch.randn({{d}}, {{d}})
        s = w.abs().amax(1) / 127
        self.h = Holder(QWeight(torch.round(w / s[:, None]).to(torch.int8), s), {make})""",
        step="        self.out.copy_(self.h(self.x))  # SITE\n        return self.out")
    path, site = write_target(tmp_path / "target" / "kept.py", tpl, seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    if kind == "view":
        assert not len(bad), table(bad)
    else:
        hit = bad[(bad.category == "step-allocation") & bad.file.str.endswith(lib.name)]
        assert len(hit) == 1 and int(hit.iloc[0].line) == marked_line(lib, "# LIBSITE"), table(bad)
