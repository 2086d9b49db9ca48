"""A size read off a tensor that one arm of a fork made in some steps and the other arm in the rest.

transformers' `_speculative_sampling` returns `torch.cat((accepted[:, :n], t), -1)` when some drafts were accepted
and the resampled token `t` alone otherwise. The caller writes it into a fixed row, `out[:, :valid.shape[1]] =
valid`: the slice's length varies only because the returned tensor's does, whose variation starts at the slice by
`n` (and the branch). In the steps where `t` came back alone, `t`'s call runs in every step with one shape, so it
is not a varying or partial call of its own; it is what the statement takes, so the size follows it and the
write is downstream, not a second dynamic-shape and baked-host-value."""

from __future__ import annotations

import random

from site_util import blocking, marked_line, table, write_target

TEMPLATE = """
import torch


def accept(cand, p, n):
    t = p.argmax(-1)[None, :]
    if n > 0:
        return torch.cat([cand[:, :n], t], dim=-1)  # ORIGIN
    return t


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.cand = torch.randint(0, {v}, (1, {k}), generator=g)
        self.p = torch.zeros(1, {v})
        self.n = torch.zeros((), dtype=torch.long)
        self.out = torch.full((1, {k} + 1), -1, dtype=torch.long)
        self.plan = {plan}

    def prepare(self, i):
        self.p.copy_(torch.randn(1, {v}))
        self.n.fill_(self.plan[i % len(self.plan)])

    def step(self):
        valid = accept(self.cand, self.p, self.n)
        self.out.fill_(-1)
        self.out[:, : valid.shape[1]] = valid  # SITE
        return self.out


def make(device):
    return Target()
"""


def test_a_size_read_off_either_arms_result_is_downstream(tmp_path):
    k = random.choice([4, 5, 6])
    audited = random.sample(range(1, k + 1), 3) + [0]
    random.shuffle(audited)
    plan = [random.randrange(k + 1) for _ in range(2)] + audited
    path, _ = write_target(tmp_path / f"arm_operand_{random.randrange(10**6)}.py", TEMPLATE,
                           seed=random.randrange(1000), v=random.choice([16, 32]), k=k, plan=plan)
    bad = blocking(path)
    site = marked_line(path, "# SITE")
    assert site not in set(bad[bad.category.isin(["dynamic-shape", "baked-host-value"])].line.astype(int)), table(bad)
    assert marked_line(path, "# ORIGIN") in set(bad[bad.category == "dynamic-shape"].line.astype(int)), table(bad)
