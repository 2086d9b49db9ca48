"""`rnn.flatten_parameters()` inside the step: with cuDNN it allocates a new flat weight buffer every call and
re-points the parameters at it (under capture: into the graph's pool, refilled each replay from the buffer freed
at capture). A CPU scan runs no op for it, so the call itself is the signal: a silent step-allocation at the
calling line. Flattening once in make(), or an RNN whose weights alias (torch skips those), gives none.
Fresh sizes and data each run."""

from __future__ import annotations

import random
import textwrap

import pytest

import audit

_TARGET = textwrap.dedent('''
    import torch
    from torch import nn

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.{cell}({e}, {h}, num_layers={layers}, batch_first=True)
            self.proj = nn.Linear({h}, {e})

        def forward(self, x, state):
            {flatten_in_forward}
            y, new = self.rnn(x, state)
            return self.proj(y), new

    class Target:
        def __init__(self, device):
            self.dec = Decoder().to(device).eval()
            self.dec.rnn.flatten_parameters()  # once, outside the step
            self.x = torch.zeros({b}, 1, {e}, device=device)
            self.h = torch.zeros({layers}, {b}, {h}, device=device)
            self.c = torch.zeros({layers}, {b}, {h}, device=device)
            self.y = torch.zeros({b}, 1, {e}, device=device)

        def prepare(self, i):
            self.x.copy_(torch.randn_like(self.x))

        @torch.no_grad()
        def step(self):
            state = (self.h, self.c) if isinstance(self.dec.rnn, nn.LSTM) else self.h
            y, new = self.dec(self.x, state)
            if isinstance(new, tuple):
                self.h.copy_(new[0])
                self.c.copy_(new[1])
            else:
                self.h.copy_(new)
            self.y.copy_(y)
            return self.y

    def make(device):
        return Target(device)
''')


def _scan(tmp_path, cell, flatten):
    path = tmp_path / "flat_decoder.py"
    path.write_text(_TARGET.format(cell=cell, e=random.randint(8, 24), h=random.randint(8, 32),
                                   layers=random.randint(1, 3), b=random.randint(1, 4),
                                   flatten_in_forward=flatten))
    inv = audit.scan(f"{path}:make", device="cpu", steps=3)
    df = inv.df[inv.df.severity.isin(("blocks-capture", "silent-corruption"))]
    return path, df


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_flatten_in_forward_is_a_silent_step_allocation(tmp_path, cell):
    path, df = _scan(tmp_path, cell, "self.rnn.flatten_parameters()  # repack")
    line = next(i for i, s in enumerate(path.read_text().splitlines(), 1) if s.endswith("# repack"))
    assert list(zip(df.category, df.line, df.severity)) == [("step-allocation", line, "silent-corruption")], \
        df[["category", "op", "line"]].to_string()


def test_flatten_once_outside_the_step_is_clean(tmp_path):
    _, df = _scan(tmp_path, random.choice(["LSTM", "GRU"]), "pass")
    assert df.empty, df[["category", "op", "line"]].to_string()


def test_flatten_with_cudnn_off_is_clean(tmp_path):
    _, df = _scan(tmp_path, "LSTM", "with torch.backends.cudnn.flags(enabled=False): self.rnn.flatten_parameters()")
    assert df.empty, df[["category", "op", "line"]].to_string()
