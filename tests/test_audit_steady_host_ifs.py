"""A loop whose body branches on a value already read back to the host (`last = row.tolist()[-1]`, then
`if last >= V // 2:`) runs no op in that `if`'s test. When the body's first statement ran equally often in
every step the trip count held: the `if` is the fork, not the loop line, however the alignment cut the
iterations. A loop whose trip count moved keeps its own finding."""

from __future__ import annotations

import random

from site_util import at, blocking, table, write_target

TEMPLATE = """
import torch

B, V = {b}, {v}

class Target:
    def __init__(self, device):
        self.logits = torch.zeros(B, V, device=device)
        self.tokens = torch.zeros(B, 4, dtype=torch.long, device=device)
        self.count = torch.zeros((), dtype=torch.long, device=device)
        self.out = torch.zeros(B, V, device=device)

    def prepare(self, i):
        self.logits.copy_(torch.randn(B, V))
        self.tokens.copy_(torch.randint(0, V, (B, 4)))
        self.count.fill_(1 + (i + {shift}) % B)

    def step(self):
        scores = self.logits.clone()
        n = {trips}  # READ
        for k in range(n):  # LOOP
            row = self.tokens[k, 1:]
            last = row.tolist()[-1]  # ROW
            if last >= V // 2:  # IF
                scores[k, V // 2:] = -1e4
            else:
                scores[k, :V // 2] -= 1.0
                scores[k] *= 0.5
        self.out.copy_(scores)
        return self.out

def make(device):
    return Target(device)
"""


def _scan(tmp_path, trips: str):
    src = TEMPLATE.format(b=random.choice([3, 4]), v=random.choice([16, 32]), shift=random.randrange(4), trips=trips)
    path, _ = write_target(tmp_path / "host_if_loop.py", src, marker="# LOOP")
    lines = {m: next(n for n, t in enumerate(path.read_text().splitlines(), 1) if f"# {m}" in t)
             for m in ("LOOP", "IF", "ROW", "READ")}
    return blocking(path), lines


def test_a_host_value_if_in_a_steady_loop_is_the_fork(tmp_path):
    for _ in range(2):
        bad, ln = _scan(tmp_path, "B")
        assert len(at(bad, "host-sync", ln["ROW"])) == 1, table(bad)
        assert len(at(bad, "data-dependent-control", ln["IF"])) == 1, table(bad)
        assert not len(at(bad, "data-dependent-control", ln["LOOP"])), table(bad)


def test_a_loop_whose_trip_count_moved_keeps_its_finding(tmp_path):
    bad, ln = _scan(tmp_path, "int(self.count.item())")
    assert len(at(bad, "host-sync", ln["READ"])) == 1, table(bad)
    assert len(at(bad, "data-dependent-control", ln["LOOP"])) == 1, table(bad)
