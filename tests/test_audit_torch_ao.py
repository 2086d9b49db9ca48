"""torch.ao is a library a model is built from: a hazard in its Python code is reported at its own line.

A QAT model served in eval() without convert() keeps its FakeQuantize modules, whose forward tests the enable
flags it keeps as device buffers (`if self.fake_quant_enabled[0] == 1:`), and a moving-average observer left
observing tests its running min (`if min_val == float("inf") and ...`): each is a host read at torch.ao's line,
with the target's call of the module as caller, not a read "inside torch" at the target's line. A MinMaxObserver
left observing updates its buffers in place and reads nothing back. Sizes and the way the modules are called
are drawn fresh."""

from __future__ import annotations

import inspect
import random

from site_util import blocking, module_target, table, write_target


def _line_of(fn, text: str) -> tuple[str, int]:
    lines, start = inspect.getsourcelines(fn)
    return inspect.getsourcefile(fn), start + next(k for k, ln in enumerate(lines) if text in ln)


def _scan(tmp_path, init: str, call: str):
    d = random.choice([8, 16, 32])
    tpl = module_target(imports="from torch.ao.quantization import FakeQuantize, MinMaxObserver, "
                                "MovingAverageMinMaxObserver, disable_observer",
                        init=init, step=f"        y = {call}  # SITE\n        self.out.copy_(y)\n        return self.out")
    path, site = write_target(tmp_path / "qat_step.py", tpl, seed=random.randrange(2**31), d=d)
    return blocking(path), site


def _hits(bad, category, file, line):
    return bad[(bad.category == category) & bad.file.str.endswith(file) & (bad.line == line)]


def test_fake_quantize_flags_are_read_at_torch_ao_lines(tmp_path):
    from torch.ao.quantization.fake_quantize import FakeQuantize

    src, fq_line = _line_of(FakeQuantize.forward, "self.fake_quant_enabled[0] == 1")
    _, obs_line = _line_of(FakeQuantize.forward, "self.observer_enabled[0] == 1")
    init = ("        self.fq = FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=-128, quant_max=127, "
            "dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)\n"
            "        self.fq(torch.randn(4, {d}))\n        self.fq.apply(disable_observer)")
    bad, site = _scan(tmp_path, init, random.choice(["self.fq(self.x)", "self.fq(self.x * 2.0)"]))
    rel = "torch/ao/quantization/fake_quantize.py"
    assert src.endswith(rel)
    for line in (fq_line, obs_line):
        hit = _hits(bad, "host-sync", rel, line)
        assert len(hit) == 1, table(bad)
        assert hit.iloc[0].caller_file.endswith("qat_step.py") and hit.iloc[0].caller_line == site, table(bad)
    assert not len(bad[bad.file.str.endswith("qat_step.py")]), table(bad)  # not "inside torch" at the call


def test_moving_average_observer_reads_its_min_at_its_line(tmp_path):
    from torch.ao.quantization.observer import MovingAverageMinMaxObserver

    _, line = _line_of(MovingAverageMinMaxObserver.forward, 'min_val == float("inf")')
    bad, site = _scan(tmp_path, "        self.obs = MovingAverageMinMaxObserver()", "self.obs(self.x) + 1.0")
    hit = _hits(bad, "host-sync", "torch/ao/quantization/observer.py", line)
    assert len(hit) == 1 and hit.iloc[0].caller_line == site, table(bad)


def test_min_max_observer_in_place_is_clean(tmp_path):
    bad, _ = _scan(tmp_path, "        self.obs = MinMaxObserver()", "self.obs(self.x) + 1.0")
    assert not len(bad), table(bad)
