"""An indexed assignment strips its value's leading size-1 dims with a `view` first (`y[idx] += v` with one row
takes `view` + `index_put_`, with two rows `index_put_` alone). In an expert loop over `torch.where` rows that
view follows the data-sized row count, already reported where it starts: no data-dependent-control at the
assignment. A real branch in the same loop (`if counts[e] == 0: continue`) still is."""

from __future__ import annotations

import random

from site_util import at, blocking, table, write_target

TEMPLATE = """
import torch

E, T, D = 4, 6, {d}

class Target:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn(E, D, D, generator=g).to(device) * 0.1
        self.x = torch.zeros(T, D, device=device)
        self.route = torch.zeros(T, 1, dtype=torch.long, device=device)
        self.gate = torch.zeros(T, 1, device=device)
        self.y = torch.zeros(T, D, device=device)

    def prepare(self, i):
        # every expert gets a token, one in some steps and more in others
        picks = [0, 1, 1, 2, 2, 3] if (i + {shift}) % 2 else [0, 1, 2, 3, 3, 3]
        random.shuffle(picks)
        self.route.copy_(torch.tensor(picks).view(T, 1))
        self.x.copy_(torch.randn(T, D))
        self.gate.copy_(torch.rand(T, 1))

    def step(self):
        self.y.zero_()
        counts = torch.bincount(self.route.flatten(), minlength=E).tolist()
        for e in range(E):
            if counts[e] == 0:  # BRANCH
                continue
            idx, top = torch.where(self.route == e)  # SITE
            self.y[idx] += (self.x[idx] @ self.w[e]) * self.gate[idx, top, None]  # WRITE
        return self.y

def make(device):
    return Target(device)
"""


def _lines(path, *marks):
    text = path.read_text().splitlines()
    return [next(n for n, t in enumerate(text, 1) if f"# {m}" in t) for m in marks]


def test_the_value_view_of_an_indexed_assignment_is_no_branch(tmp_path):
    for _ in range(2):
        src = "import random\n" + TEMPLATE.format(seed=random.randrange(2**31), d=random.choice([4, 8]),
                                                  shift=random.randrange(2))
        path, site = write_target(tmp_path / "expert_rows.py", src)
        bad = blocking(path)
        write, = _lines(path, "WRITE")
        assert len(at(bad, "host-sync", site)) == 1, table(bad)
        assert not len(at(bad, "data-dependent-control", write)), table(bad)


def test_a_branch_on_the_counts_in_the_same_loop_is_still_control(tmp_path):
    # one expert gets no token in every other step: the `continue` forks the loop
    src = "import random\n" + TEMPLATE.format(seed=random.randrange(2**31), d=4, shift=random.randrange(2)) \
        .replace("[0, 1, 2, 3, 3, 3]", "[0, 1, 1, 3, 3, 3]")
    path, _ = write_target(tmp_path / "expert_rows_skip.py", src)
    bad = blocking(path)
    branch, = _lines(path, "BRANCH")
    assert len(at(bad, "data-dependent-control", branch)) == 1, table(bad)
