"""A torch DataLoader's iterator advanced inside the step (`next(self.it)`): its position lives in the Python
attributes of torch's `_SingleProcessDataLoaderIter` (`_num_yielded`, the sampler's generator), which a replay never
advances, so the graph hands out the captured batch for ever. torch's data-loading objects are step state like
a user object's, and the target's `next()` on the iterator is the line to act on; the same loader advanced in
prepare() is no finding."""

from __future__ import annotations

import random

from site_util import FED_STEP, at, blocking, table, write_target

TARGET = """
import torch
from torch.utils.data import DataLoader, TensorDataset


class Feeder:
    def __init__(self, loader):
        self.batches = iter(loader)

    def pull(self):
        return {pull}


class Target:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g, device=device)
        data = torch.randn({n}, {d}, generator=g).to(device)
        self.it = iter(DataLoader(TensorDataset(data), batch_size={b}, shuffle={shuffle}))
        self.feed = Feeder(DataLoader(TensorDataset(data), batch_size={b}))
        self.x = torch.zeros({b}, {d}, device=device)
        self.out = torch.zeros({b}, {d}, device=device)
""" + FED_STEP

IN_STEP = ["(x,) = next(self.it); self.x.copy_(x)", "self.x.copy_(next(self.it)[0])",
           "self.x.copy_(self.feed.pull()[0])"]


def _target(tmp_path, take: str, prepare: str = "pass"):
    return write_target(tmp_path / f"loader_state_{random.randrange(10**9)}.py", TARGET, take=take, prepare=prepare,
                        pull="next(self.batches)  # PULL", seed=random.randrange(2**31), d=random.choice([4, 8]),
                        b=random.choice([2, 3]), n=random.choice([64, 96]), shuffle=random.choice([True, False]))


def test_a_dataloader_iterator_advanced_in_the_step_is_a_side_effect_at_the_next_call(tmp_path):
    take = random.choice(IN_STEP)
    path, site = _target(tmp_path, take)
    bad = blocking(path)
    line = site if "feed" not in take else next(n for n, t in enumerate(path.read_text().splitlines(), 1)
                                                 if "# PULL" in t)
    assert len(at(bad, "cpu-side-effect", line)), table(bad)
    assert "_SingleProcessDataLoaderIter" in " ".join(at(bad, "cpu-side-effect", line).message), table(bad)


def test_the_same_loader_advanced_in_prepare_is_no_finding(tmp_path):
    path, _ = _target(tmp_path, "pass", prepare=random.choice(["self.x.copy_(next(self.it)[0])",
                                                                "self.x.copy_(self.feed.pull()[0])"]))
    bad = blocking(path)
    assert not len(bad), table(bad)
