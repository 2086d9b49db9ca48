"""torch.linalg eigen- and singular-value decompositions check their `info` on the host inside one kernel
(no `_linalg_check_errors` reaches the dispatcher); torch's docs say each synchronizes. Each is a host-sync at
the line that called it, under no_grad and inference_mode alike; QR, slogdet and the `_ex` solves are not.
Fresh sizes and data each run."""

from __future__ import annotations

import random
import textwrap

import pytest

import audit

_TARGET = textwrap.dedent('''
    import torch

    class Spectral:
        def __init__(self, device):
            self.a = torch.randn({n}, {n}, device=device)
            self.b = torch.randn({m}, {n}, device=device)
            self.out = torch.zeros((), device=device)

        def prepare(self, i):
            self.a.copy_(torch.randn({n}, {n}))

        @{mode}
        def step(self):
            sym = self.a @ self.a.mT + torch.eye({n}, device=self.a.device)
            w = torch.linalg.eigvalsh(sym)  # eigvalsh
            _, v = torch.linalg.eigh(sym)  # eigh
            s = torch.linalg.svdvals(self.b)  # svdvals
            u, s2, vh = torch.linalg.svd(self.b, full_matrices=False)  # svd
            spec = torch.linalg.matrix_norm(self.a, ord=2)  # spectral norm
            p = torch.linalg.pinv(self.b)  # pinv
            ev = torch.linalg.eigvals(self.a)  # eigvals
            q, r = torch.linalg.qr(self.b)
            sign, ld = torch.linalg.slogdet(sym)
            x, info = torch.linalg.solve_ex(sym, self.b.mT)
            self.out.copy_(w.sum() + v.sum() + s.sum() + s2.sum() + spec + p.sum() + ev.real.sum() + r.sum() + ld
                           + x.sum() + info.sum())
            return self.out

    def make(device):
        return Spectral(device)
''')

_MARKS = ("eigvalsh", "eigh", "svdvals", "svd", "spectral norm", "pinv", "eigvals")


@pytest.mark.parametrize("mode", ["torch.no_grad()", "torch.inference_mode()"])
def test_decompositions_that_check_info_in_their_kernel_are_host_syncs(tmp_path, mode):
    n, m = random.randint(3, 9), random.randint(10, 14)
    path = tmp_path / "spectral.py"
    path.write_text(_TARGET.format(n=n, m=m, mode=mode))
    inv = audit.scan(f"{path}:make", device="cpu", steps=3)
    lines = path.read_text().splitlines()
    want = {next(i for i, s in enumerate(lines, 1) if s.endswith(f"# {mark}")) for mark in _MARKS}
    df = inv.df[inv.df.severity.isin(("blocks-capture", "silent-corruption"))]
    assert set(df.category) == {"host-sync"}, df[["category", "op", "line"]].to_string()
    assert set(df.line.astype(int)) == want, df[["op", "line"]].to_string()
    assert df.message.str.contains("no `_ex` form").all()
