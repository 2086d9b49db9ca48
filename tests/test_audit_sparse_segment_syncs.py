"""Host reads of sparse and segmented layouts that no traced op shows on a CPU scan: a sparse matmul with an
uncoalesced COO operand (a GPU's kernel coalesces it first and reads the merged nnz back), `coalesce()` in the
step, and `torch.segment_reduce(..., lengths=)` without `unsafe=True` (its kernel checks the lengths with
`.item()`), and a CSR tensor built without its size (its constructor reads the column ids' max). Their clean
twins: a COO tensor coalesced in make(), `offsets=`, `unsafe=True`, a CSR tensor given its size. Fresh sizes each run."""

from __future__ import annotations

import random
import textwrap

import pytest

import audit

_TARGET = textwrap.dedent('''
    import torch

    N, E, D, B = {n}, {e}, {d}, {b}

    class Ragged:
        def __init__(self, device):
            self.idx = torch.zeros(2, E, dtype=torch.long, device=device)
            self.w = torch.zeros(E, device=device)
            self.h = torch.zeros(N, D, device=device)
            self.lens = torch.zeros(B, dtype=torch.long, device=device)
            self.offsets = torch.zeros(B + 1, dtype=torch.long, device=device)
            self.fixed = torch.sparse_coo_tensor(torch.randint(0, N, (2, E)), torch.rand(E), (N, N)).coalesce().to(device)
            self.crow = torch.arange(0, N * 2 + 1, 2, device=device)
            self.col = torch.zeros(N * 2, dtype=torch.long, device=device)
            self.out = torch.zeros((), device=device)

        def prepare(self, i):
            g = torch.Generator().manual_seed(i)
            self.idx.copy_(torch.randint(0, N, (2, E), generator=g))
            self.w.copy_(torch.rand(E, generator=g))
            self.h.copy_(torch.randn(N, D, generator=g))
            lens = torch.full((B,), N // B)
            lens[-1] += N - int(lens.sum())
            self.lens.copy_(lens)
            self.offsets.copy_(torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]))
            self.col.copy_(torch.stack([torch.arange(N), torch.full((N,), N - 1)], 1).reshape(-1))

        @{mode}
        def step(self):
            adj = torch.sparse_coo_tensor(self.idx, self.w, (N, N))
            y = torch.sparse.mm(adj, self.h)  # HAZARD mm
            z = adj @ self.h  # HAZARD matmul
            c = adj.coalesce()  # HAZARD coalesce
            f = self.fixed @ self.h
            s = torch.segment_reduce(self.h, "sum", lengths=self.lens)  # HAZARD segment
            t = torch.segment_reduce(self.h, "sum", lengths=self.lens, unsafe=True)
            o = torch.segment_reduce(self.h, "max", offsets=self.offsets)
            csr = torch.sparse_csr_tensor(self.crow, self.col, self.w[: 2 * N])  # HAZARD csr
            sized = torch.sparse_csr_tensor(self.crow, self.col, self.w[: 2 * N], (N, N))
            self.out.copy_((csr @ self.h).sum() + (sized @ self.h).sum() + y.sum() + z.sum() + c.to_dense().sum() + f.sum() + s.sum() + t.sum() + o.sum())
            return self.out

    def make(device):
        return Ragged(device)
''')


@pytest.mark.parametrize("mode", ["torch.no_grad()", "torch.inference_mode()"])
def test_uncoalesced_sparse_matmul_coalesce_and_checked_segment_lengths_are_host_syncs(tmp_path, mode):
    b = random.randint(2, 4)
    src = _TARGET.format(n=b * random.randint(3, 6), e=b * 12 + random.randint(0, 20), d=random.randint(3, 8), b=b, mode=mode)
    path = tmp_path / "ragged.py"
    path.write_text(src)
    inv = audit.scan(f"{path}:make", device="cpu", steps=3)
    lines = path.read_text().splitlines()
    want = {i for i, s in enumerate(lines, 1) if "# HAZARD" in s}
    df = inv.df[inv.df.severity.isin(("blocks-capture", "silent-corruption"))]
    assert set(df.category) == {"host-sync"}, df[["category", "op", "line"]].to_string()
    assert set(df.line) == want, df[["category", "op", "line", "message"]].to_string()
