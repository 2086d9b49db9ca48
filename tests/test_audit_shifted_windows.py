"""cpu-side-effect: a window of the step's tensors that shifts is Python state, also when the step reads it back.

A streaming encoder keeps its left context as the last k frame embeddings in a `deque(maxlen=k)` (or a list it
appends to and pops), and stacks the window each step. The tensor appended escapes into later steps
(step-allocation at the line that made it), and the append moves the older tensors one position down: a replay
reads the window the capture left and never shifts it, a cpu-side-effect at the append of its own. A dict slot
rebound in place to the step's new tensor, read back by the next step, stays step-allocation's alone. Sizes,
window length, spelling and seed are drawn fresh."""

from __future__ import annotations

import random

from site_util import blocking, marked_line, module_target, table, write_target

WINDOWS = {
    "deque": ("from collections import deque",
              "        self.hist = deque([torch.zeros(1, {d}) for _ in range({k})], maxlen={k})",
              "        self.hist.append(h)  # SHIFT"),
    "list": ("",
             "        self.hist = [torch.zeros(1, {d}) for _ in range({k})]",
             "        self.hist.append(h)  # SHIFT\n        self.hist.pop(0)"),
}


def _scan(tmp_path, kind: str):
    d, k = random.choice([8, 16, 24]), random.choice([2, 3, 4])
    op = random.choice(["self.lin(self.x)", "torch.tanh(self.lin(self.x))", "self.lin(self.x) * 0.5"])
    if kind == "slot":
        imports, init = "", "        self.hist = {{'h': torch.zeros(1, {d})}}"
        keep, read = "        self.hist['h'] = h", "torch.stack([self.hist['h'], self.x], 1)"
    else:
        imports, init, keep = WINDOWS[kind]
        read = "torch.stack(list(self.hist), 1)"
    init = init.format(d=d, k=k).replace("{", "{{").replace("}", "}}")
    tpl = module_target(imports=imports, init=f"        self.lin = nn.Linear({{d}}, {{d}})\n{init}", step=f"""\
        ctx = {read}
        h = {op}  # SITE
{keep}
        self.out.copy_(ctx.mean(1) + h)
        return self.out""")
    path, site = write_target(tmp_path / f"window_{kind}.py", tpl, seed=random.randrange(2**31), d=d)
    return blocking(path), path, site


def test_a_shifting_window_of_escaped_tensors_is_a_cpu_side_effect(tmp_path):
    for kind in ("deque", "list"):
        bad, path, site = _scan(tmp_path, kind)
        alloc = bad[bad.category == "step-allocation"]
        assert list(alloc.line) == [site], table(bad)
        cse = bad[bad.category == "cpu-side-effect"]
        assert marked_line(path, "# SHIFT") in set(cse.line), table(bad)


def test_a_slot_rebound_in_place_stays_step_allocation(tmp_path):
    bad, _, site = _scan(tmp_path, "slot")
    assert list(bad.category) == ["step-allocation"] and list(bad.line) == [site], table(bad)
