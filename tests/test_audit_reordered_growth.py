"""dynamic-shape origin of a sequence a step reorders, then grows.

Beam search keeps the running ids as one tensor: each step gathers the rows by beam index and appends the new
tokens, `self.seqs = torch.cat([self.seqs[beam_idx], tok], -1)` (or `index_select`, `take_along_dim`). The
gather is the call that reads last step's tensor, yet it keeps its shape: it only passes the growth on. The
`cat`, whose inputs all come from its own step, is where the shape changes, and is the one origin. A buffer of
fixed width written at a device position has no dynamic shape."""

from __future__ import annotations

import random

from site_util import blocking, marked_line, table, write_target

GROWN = """
import torch


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.logits = torch.zeros({n}, {v})
        self.seqs = torch.randint(0, {v}, ({n}, 3))
        self.scores = torch.zeros({n})

    def prepare(self, i):
        self.logits.copy_(torch.randn({n}, {v}))

    @torch.no_grad()
    def step(self):
        cand = (torch.log_softmax(self.logits, -1) + self.scores[:, None]).view(-1)
        top, idx = cand.topk({n})
        src = idx // {v}
        self.scores.copy_(top)
        rows = {gather}
        self.seqs = torch.cat([rows, (idx % {v})[:, None]], dim=-1)  # SITE
        return self.seqs


def make(device):
    return Target()
"""

FIXED = """
import torch


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.logits = torch.zeros({n}, {v})
        self.seqs = torch.randint(0, {v}, ({n}, 32))
        self.scratch = torch.empty_like(self.seqs)
        self.scores = torch.zeros({n})
        self.pos = torch.tensor(3)

    def prepare(self, i):
        self.logits.copy_(torch.randn({n}, {v}))

    @torch.no_grad()
    def step(self):
        cand = (torch.log_softmax(self.logits, -1) + self.scores[:, None]).view(-1)
        top, idx = cand.topk({n})
        src = idx // {v}
        self.scores.copy_(top)
        torch.index_select(self.seqs, 0, src, out=self.scratch)
        self.seqs.copy_(self.scratch)
        self.seqs.scatter_(1, self.pos.view(1, 1).expand({n}, 1), (idx % {v})[:, None])  # SITE
        self.pos += 1
        return self.seqs


def make(device):
    return Target()
"""

GATHERS = ["self.seqs[src]", "self.seqs.index_select(0, src)", "self.seqs.index_select(0, src) * 1"]


def _fields():
    return dict(seed=random.randrange(2**31), n=random.choice([3, 4, 6]), v=random.choice([32, 64, 128]))


def _grown(tmp_path, gather):
    path, site = write_target(tmp_path / f"beam_grown_{random.randrange(10**6)}.py", GROWN, gather=gather,
                              **_fields())
    bad = blocking(path)
    shapes = bad[bad.category == "dynamic-shape"]
    assert site in set(shapes.line.astype(int)), (gather, table(bad))
    assert marked_line(path, "rows = ") not in set(bad.line.astype(int)), (gather, table(bad))


def test_a_reordered_then_grown_sequence_is_a_dynamic_shape_at_its_cat(tmp_path):
    _grown(tmp_path, random.choice(GATHERS))


def test_a_gather_by_take_along_dim_follows_the_width_it_broadcasts_to(tmp_path):
    """take_along_dim expands the [n, 1] index to the sequence's width before it expands the sequence: the index's
    expand takes its size from the other operand of the same call, downstream of the cat."""
    _grown(tmp_path, "torch.take_along_dim(self.seqs, src[:, None], dim=0)")


def test_a_fixed_buffer_written_at_a_device_position_has_no_dynamic_shape(tmp_path):
    path, _ = write_target(tmp_path / f"beam_fixed_{random.randrange(10**6)}.py", FIXED, **_fields())
    bad = blocking(path)
    assert bad.empty, table(bad)
