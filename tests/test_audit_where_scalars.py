"""`torch.where` with a 0-dim host operand on a CPU scan: the copy inside where() is reported at the where line,
unless the step sent that scalar to the device itself first (`torch.tensor(0.0).to(x.device)`): then the `.to`
is the copy, and where() reads a device tensor."""

from __future__ import annotations

import random
import textwrap

import audit


def test_a_scalar_sent_to_the_device_first_is_one_finding_at_the_send(tmp_path):
    b, d = random.randint(1, 8), random.randint(2, 32)
    fill = round(random.uniform(-5, 5), 2)
    src = textwrap.dedent(f"""
        import torch


        class T:
            def __init__(self, device):
                self.x = torch.randn({b}, {d}, device=device)
                self.out = torch.zeros({b}, {d}, device=device)

            def prepare(self, i):
                self.x.normal_()

            def step(self):
                y = torch.where(self.x > 0, self.x, torch.tensor({fill}).to(self.x.device))  # SENT
                z = torch.where(self.x > 0, y, torch.full((), {fill}))  # HOST
                self.out.copy_(z)
                return self.out


        def make(device):
            return T(device)
        """)
    (tmp_path / "where_target.py").write_text(src)
    lines = {tag: i for i, t in enumerate(src.splitlines(), 1) for tag in ("SENT", "HOST") if t.endswith(f"# {tag}")}
    inv = audit.scan(f"{tmp_path / 'where_target.py'}:make", device="cpu", steps=3)
    bad = inv.blocking()
    got = sorted(zip(bad.line.astype(int), bad.category, bad.op))
    assert got == [(lines["SENT"], "pageable-copy", "Tensor.to"), (lines["HOST"], "pageable-copy", "aten.where")], got
