"""dynamic-shape: a factory inside one torch call that sizes its output from the pieces the statement passed.

Jagged features turned into a padded batch: `segs = torch.split(values, lengths.tolist())` (a varying shape, and a
baked value, at that line), then `pad_sequence(list(segs), batch_first=True)`. torch's `pad_sequence` runs below
any Python statement: it makes `full([B, max_len])` and copies each piece into a narrowed row. The factory takes no
tensor and its size varies, yet it is downstream of the split (the longest piece's length, another piece in another
step), and so are the narrows' bounds: no second dynamic-shape or baked-host-value at the pad_sequence line. A
factory sized by a host counter in the same place still is one.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, marked_line, table, write_target

TARGET = """
import torch
from torch.nn.utils.rnn import pad_sequence

B, MAXL, D = {b}, {maxl}, {d}


class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.emb = torch.nn.Embedding(50, D).to(device)
        self.values = torch.zeros(B * MAXL, dtype=torch.long, device=device)
        self.lengths = torch.zeros(B, dtype=torch.long, device=device)
        self.out = torch.zeros(B, D, device=device)
        self.schedule = {schedule}
        self.n = 1

    def prepare(self, i):
        self.values.copy_(torch.randint(0, 50, (B * MAXL,)))
        self.lengths.copy_(torch.tensor(self.schedule[i % len(self.schedule)]))

    @torch.no_grad()
    def step(self):
        lens = self.lengths.tolist()
        segs = torch.split(self.values[: B * MAXL], [n for n in lens] + [B * MAXL - sum(lens)])  # SPLIT
        padded = {pad}  # PAD
        self.n += 1
        self.out.copy_(self.emb(padded[:B]).mean(1))
        return self.out


def make(device):
    return Target(device)
"""


def _schedule(b: int, maxl: int) -> list:
    tops = random.sample(range(2, maxl + 1), 6)
    out = []
    for top in tops:
        lens = [random.randint(1, top) for _ in range(b)]
        lens[random.randrange(b)] = top
        out.append(lens)
    return out


def _scan(tmp_path, pad: str):
    b, maxl = random.choice([3, 4]), random.choice([8, 10])
    path, split = write_target(tmp_path / "split_pad.py", TARGET, marker="# SPLIT", b=b, maxl=maxl,
                               d=random.choice([4, 8]), seed=random.randrange(2**31), schedule=repr(_schedule(b, maxl)),
                               pad=pad)
    return blocking(path), split, marked_line(path, "# PAD")


def test_pad_sequence_of_split_pieces_is_downstream_of_the_split(tmp_path):
    bad, split, pad = _scan(tmp_path, "pad_sequence(list(segs[:-1]), batch_first=True)")
    assert split in set(bad[bad.category == "dynamic-shape"].line), table(bad)
    shaped = bad[bad.category.isin(["dynamic-shape", "baked-host-value"])]
    assert pad not in set(shaped.line), table(bad)


def test_a_factory_sized_by_a_host_counter_there_is_still_an_origin(tmp_path):
    bad, split, pad = _scan(tmp_path, "torch.zeros(B, self.n, dtype=torch.long, device=self.values.device)")
    assert pad in set(bad[bad.category == "dynamic-shape"].line), table(bad)



TOP_P = """
import torch

B, V = 2, {v}


def top_p_sample(logits, top_p):
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, sorted_idx = torch.sort(probs, dim=-1, descending=True)
    keep = (sorted_probs.cumsum(-1) - sorted_probs) < top_p
    k = int(keep.sum(dim=-1).max())
    nucleus = sorted_probs[:, :k] * keep[:, :k]  # FIRST
    choice = torch.multinomial(nucleus / nucleus.sum(-1, keepdim=True), 1)
    return sorted_idx[:, :k].gather(1, choice)  # SITE


class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.w = torch.randn(8, V, device=device)
        self.h = torch.zeros(B, 8, device=device)
        self.scale = torch.ones(B, 1, device=device)
        self.tok = torch.zeros(B, 1, dtype=torch.long, device=device)

    def prepare(self, i):
        self.h.copy_(torch.randn(B, 8))
        self.scale.fill_((0.25, 1.0, 4.0, 0.5, 2.0, 8.0)[i % 6])

    @torch.no_grad()
    def step(self):
        self.tok.copy_(top_p_sample((self.h @ self.w) * self.scale, 0.9))
        return self.tok


def make(device):
    return Target(device)
"""


def test_a_second_slice_by_the_host_length_is_an_origin_too(tmp_path):
    """`k` read back once slices two tensors in two statements: the second slice (whose statement goes on with a
    gather) is no factory inside a torch call, and stays a source of its own."""
    path, site = write_target(tmp_path / "top_p.py", TOP_P, v=random.choice([128, 256]), seed=random.randrange(2**31))
    bad = blocking(path)
    assert {"dynamic-shape", "baked-host-value"} <= set(bad[bad.line == site].category), table(bad)


JAGGED = """
import torch
from torch.nn.utils.rnn import pad_sequence

V, D, B, MAXL = 300, {d}, 4, {maxl}


class Step:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.emb = torch.nn.Embedding(V, D, padding_idx=0).to(device)
        self.values = torch.zeros(B * MAXL, dtype=torch.long, device=device)
        self.lengths = torch.zeros(B, dtype=torch.long, device=device)
        self.out = torch.zeros(B, D, device=device)

    def prepare(self, i):
        self.values.copy_(torch.randint(1, V, (B * MAXL,)))
        self.lengths.copy_(torch.tensor({lengths}))

    @torch.no_grad()
    def step(self):
        lens = self.lengths.tolist()
        segs = torch.split(self.values[: sum(lens)], lens)  # SPLIT
        padded = pad_sequence(list(segs), batch_first=True)  # PAD
        self.out.copy_(self.emb(padded).sum(1))
        return self.out


def make(device):
    return Step(device)
"""


@pytest.mark.parametrize("longest", ["moving", "fixed"])
def test_the_rows_pad_sequence_narrows_are_downstream_too(tmp_path, longest):
    """The narrowed rows of the buffer pad_sequence made (views of it, in the same call) follow the split: also when
    the longest piece keeps its length, so the buffer keeps its shape and only the rows' bounds move."""
    a, b = random.randint(2, 4), random.randint(1, 3)
    lengths = f"[1 + i, {a}, {b}, MAXL - i]" if longest == "moving" else f"[1 + i % 3, {a}, MAXL, {b} + i % 2]"
    path, split = write_target(tmp_path / "jagged.py", JAGGED, marker="# SPLIT", d=random.choice([4, 8]),
                               maxl=random.choice([10, 12]), seed=random.randrange(2**31), lengths=lengths)
    bad = blocking(path)
    assert split in set(bad[bad.category == "dynamic-shape"].line), table(bad)
    pad = marked_line(path, "# PAD")
    assert pad not in set(bad[bad.category.isin(["dynamic-shape", "baked-host-value"])].line), table(bad)
