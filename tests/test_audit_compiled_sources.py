"""Code that runs without a Python frame of its own file still has its hazards at the user's line.

- torch.fx: a GraphModule runs generated code (`<eval_with_key>`); each node is matched back to the
  expression of the same kind and rank in the traced forward, so two `.item()` reads land on their
  own lines, not on the step's call of the module.
- torch.jit.script: the interpreter runs no Python frame; an op inside is matched to the graph node of
  the same aten name and rank, whose source range is the line (`int(live.sum())`).
"""

from __future__ import annotations

import random
import warnings

from site_util import blocking, marked_line, module_target, table, write_target

FX_TARGET = module_target(imports="import torch.fx", prelude="""
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear({d}, {d})

    def forward(self, x):
        a = x.abs().max().item()  # FIRST
        h = self.lin(x) * {k}
        b = h.sum().item()  # SECOND
        return h / (a + b)
""", init="        self.block = torch.fx.symbolic_trace(Block())", step="""\
        self.out.copy_(self.block(self.x))  # SITE
        return self.out""")


def _window_target(prelude: str, call: str, init: str = "") -> str:
    """`prelude`, then a target whose step reads a window of `self.k` as long as the live slots are
    many, through `call` (a script function or a scripted module)."""
    return prelude + f"""

class Target:
    def __init__(self):
        torch.manual_seed({{seed}})
{init}
        self.k = torch.randn(8, {{d}})
        self.live = torch.zeros(8, dtype=torch.long)
        self.out = torch.zeros(1, {{d}})

    def prepare(self, i):
        self.live[: 1 + i % 8].fill_(1)

    @torch.no_grad()
    def step(self):
        self.out.copy_({call}(self.k, self.live))  # SITE
        return self.out

def make(device):
    return Target()
"""


JIT_TARGET = _window_target("""
import torch


@torch.jit.script
def {fn}(k, live):
    h = k * {k}
    n = int(live.sum())  # READ
    return h[:n].mean(0, keepdim=True)
""", "{fn}")


def test_fx_graphmodule_reads_land_on_the_traced_lines(tmp_path):
    path, _ = write_target(tmp_path / "fx_target.py", FX_TARGET, seed=random.randrange(2**31),
                           d=random.choice([4, 8]), k=random.choice([2.0, 0.5, 3.0]))
    bad = blocking(path)
    lines = set(bad[bad.category == "host-sync"].line)
    assert lines == {marked_line(path, "# FIRST"), marked_line(path, "# SECOND")}, table(bad)


def test_jit_script_read_lands_inside_the_script_function(tmp_path):
    fn = f"window_{random.randrange(10**6)}"
    path, _ = write_target(tmp_path / "jit_target.py", JIT_TARGET, fn=fn, seed=random.randrange(2**31),
                           d=random.choice([4, 8]), k=random.choice([2.0, 0.5, 3.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script is deprecated
        bad = blocking(path)
    read = bad[bad.category == "host-sync"]
    assert set(read.line) == {marked_line(path, "# READ")}, table(bad)
    assert set(read.caller_line) == {marked_line(path, "# READ")}, table(bad)


SCRIPTED_MODULE = _window_target("""
import torch
from torch import nn


class Window(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear({d}, {d})

    def forward(self, k, live):
        h = self.lin(k) * {k}
        n = int(live.sum())  # READ
        return h[:n].mean(0, keepdim=True)

""", "self.window", init="        self.window = torch.jit.script(Window())")


def test_a_scripted_module_scans_and_its_read_lands_in_forward(tmp_path):
    """A RecursiveScriptModule's parameter tables iterate only through keys() (the state snapshot used to
    raise on them and end the scan), and its forward runs through nn.Module's hidden frames."""
    path, _ = write_target(tmp_path / "scripted_target.py", SCRIPTED_MODULE, seed=random.randrange(2**31),
                           d=random.choice([4, 8]), k=random.choice([2.0, 0.5, 3.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        bad = blocking(path)
    assert set(bad[bad.category == "host-sync"].line) == {marked_line(path, "# READ")}, table(bad)
