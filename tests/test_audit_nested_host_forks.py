"""A loop over device rows whose body reads each row back (`ids = row.tolist()`) and then decides in nested
host loops and `if`s which entries to penalise (a repetition penalty written in Python) forks inside those
nested decisions: the outer loop ran as often in every step. When a step penalises nothing the alignment
anchors the other step's extra ops at the outer loop's top; the finding still names the nested decision whose body ran them, not the outer loop. An
outer loop whose trip count moved keeps its own finding."""

from __future__ import annotations

import random

from site_util import at, blocking, table, write_target

TEMPLATE = """
import torch

B, V, W = {b}, {v}, {w}

class Target:
    def __init__(self, device):
        self.logits = torch.zeros(B, V, device=device)
        self.history = torch.zeros(B, W, dtype=torch.long, device=device)
        self.rows = torch.zeros((), dtype=torch.long, device=device)
        self.out = torch.zeros(B, dtype=torch.long, device=device)

    def prepare(self, i):
        self.logits.copy_(torch.randn(B, V))
        ids = torch.stack([torch.randperm(V)[:W] for _ in range(B)])
        k = (i + {shift}) % 3  # k tokens repeated {least} times: a different number to penalise each step, none in some
        ids[:, :k * {least}] = ids[:, :k].repeat_interleave({least}, dim=1)
        self.history.copy_(ids[:, torch.randperm(W)])
        self.rows.fill_(1 + (i + {shift}) % B)

    def step(self):
        scores = self.logits.clone()
        n = {n}  # READ
        for r, row in {rows}:  # LOOP
            ids = row.tolist()  # ROW
            seen = {{}}
            for t in ids:
                seen[t] = seen.get(t, 0) + 1
            for tok, c in seen.items():
                if c >= {least}:  # IF
                    scores[r, tok] -= 0.5 * c
        self.out.copy_(scores.argmax(-1))
        return self.out

def make(device):
    return Target(device)
"""


def _scan(tmp_path, n: str, rows: str, b: int):
    path, _ = write_target(tmp_path / "nested_penalty.py", TEMPLATE, marker="# LOOP", b=b, v=random.choice([16, 32]),
                           w=random.choice([12, 16]), least=random.choice([3, 4]),
                           shift=random.randrange(4), n=n, rows=rows)
    lines = {m: next(n for n, t in enumerate(path.read_text().splitlines(), 1) if f"# {m}" in t)
             for m in ("LOOP", "IF", "ROW", "READ")}
    return blocking(path), lines


def test_the_nested_decision_is_the_fork_when_the_outer_loop_held(tmp_path):
    for _ in range(2):
        bad, ln = _scan(tmp_path, "B", "enumerate(self.history)", b=1)
        assert len(at(bad, "host-sync", ln["ROW"])) == 1, table(bad)
        assert not len(at(bad, "data-dependent-control", ln["LOOP"])), table(bad)
        assert len(at(bad, "data-dependent-control", ln["IF"])) == 1, table(bad)


def test_an_outer_loop_whose_trips_moved_keeps_its_finding(tmp_path):
    bad, ln = _scan(tmp_path, "int(self.rows.item())", "((r, self.history[r]) for r in range(n))",
                    b=random.choice([3, 4]))
    assert len(at(bad, "host-sync", ln["READ"])) == 1, table(bad)
    assert len(at(bad, "data-dependent-control", ln["LOOP"])) == 1, table(bad)
