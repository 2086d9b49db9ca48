"""`x[i]` with `i` a 0-dim integer device tensor: torch's indexing reads `i` back (`.item()`) and selects with the
Python int. The read is one host-sync at that line; the select's changing index is that same value, not a second
(baked-host-value) finding. An int the user reads on one line and indexes with on the next is still baked there.
Fresh sizes and data each run."""

from __future__ import annotations

import random
import textwrap

import audit

_TARGET = '''
    import torch

    class Lookup:
        def __init__(self, device):
            self.table = torch.randn({rows}, {width}, device=device)
            self.tok = torch.zeros((), dtype=torch.long, device=device)
            self.out = torch.zeros({width}, device=device)
            self.gen = torch.Generator().manual_seed({seed})

        def prepare(self, i):
            self.tok.copy_(torch.randint(0, {rows}, (), generator=self.gen))

        @torch.no_grad()
        def step(self):
{body}
            return self.out

    def make(device):
        return Lookup(device)
'''

_BY_TORCH = ("            self.out.copy_(self.table[self.tok] * 2.0)  # indexed\n")
_BY_USER = ("            k = int(self.tok)  # read\n"
            "            self.out.copy_(self.table[k] * 2.0)  # indexed\n")


def _blocking(tmp_path, body):
    rows = random.randint(40, 90)
    src = textwrap.dedent(_TARGET.format(rows=rows, width=random.randint(3, 9), seed=random.randint(0, 10_000), body=body.rstrip("\n")))
    path = tmp_path / "lookup.py"
    path.write_text(src)
    inv = audit.scan(f"{path}:make", device="cpu", steps=4)
    marks = {s.rsplit("# ", 1)[1]: i for i, s in enumerate(src.splitlines(), 1) if "  # " in s}
    df = inv.df[inv.df.severity.isin(("blocks-capture", "silent-corruption"))]
    return marks, {(c, int(ln)) for c, ln in zip(df.category, df.line)}


def test_a_zero_dim_device_index_is_one_host_read_not_a_baked_select(tmp_path):
    marks, got = _blocking(tmp_path, _BY_TORCH)
    assert got == {("host-sync", marks["indexed"])}, got


def test_an_int_the_user_read_stays_a_baked_index(tmp_path):
    marks, got = _blocking(tmp_path, _BY_USER)
    assert got == {("host-sync", marks["read"]), ("baked-host-value", marks["indexed"])}, got
