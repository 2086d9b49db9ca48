"""A buffer sliced to a data-dependent length read off an earlier op (`hist[: counts.numel()] += counts` after a
`bincount`): the slice follows the bincount's varying shape, so the bincount is the one place to fix. In steps
where the length fills the buffer torch runs no `slice` (an alias), and those steps must not turn the slice's
bound into a baked host value of its own."""

from __future__ import annotations

import random
import textwrap

import audit

SRC = textwrap.dedent('''
    import torch

    V = VOCAB

    class Hist:
        def __init__(self, device):
            self.tok = torch.zeros(NTOK, dtype=torch.long, device=device)
            self.hist = torch.zeros(V, device=device)

        def prepare(self, i):
            top = V if i % 2 else V - 1 - (i % 3)  # odd steps reach the last id: the count fills the buffer
            t = torch.randint(0, top, (NTOK,))
            if i % 2:
                t[0] = V - 1
            self.tok.copy_(t)

        @torch.no_grad()
        def step(self):
            counts = torch.bincount(self.tok)  # the origin
            self.hist[: counts.numel()] += counts  # follows it
            return self.hist
''')


def test_the_bincount_is_the_only_place_reported(tmp_path):
    src = SRC.replace("VOCAB", str(random.randint(12, 40))).replace("NTOK", str(random.randint(6, 10)))
    path = tmp_path / "hist.py"
    path.write_text(src + "\n\ndef make(device='cpu'):\n    return Hist(device)\n")
    lines = src.splitlines()
    origin = next(n for n, t in enumerate(lines, 1) if "# the origin" in t)
    inv = audit.scan(f"{path}:make", device="cpu", steps=6)
    bad = inv.df[inv.df.severity != "info"]
    got = set(zip(bad.line.astype(int), bad.category))
    assert got == {(origin, "host-sync"), (origin, "dynamic-shape")}, bad[["line", "category", "message"]].to_string()
