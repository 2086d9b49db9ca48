"""pageable-copy (CPU scan): a host copy the step made itself, copied back into device memory in the step.

diffusers' `EMAModel` swaps EMA weights in for a validation forward: `store()` keeps
`[p.detach().cpu().clone() for p in params]`, `restore()` puts them back with `param.data.copy_(c.data)`. On a GPU
`.cpu()` makes pageable host memory and the restore is a pageable host-to-device copy (capture raises). On a CPU
scan `.cpu()` returns the tensor itself; the op chained on its line makes the new memory, which a GPU makes on the
host (`audit/detectors/host/step_copies.py`). The store's `.cpu()` stays the host-sync it is. A device clone
(`p.detach().clone()`) copied back is clean. Sizes, names and spellings are drawn fresh."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, module_target, table, write_target

PRELUDE = """
class Swap:
    def __init__(self, params):
        self.shadow = [p.detach().clone() * 0.5 for p in params]
        self.{name} = None

    def store(self, params):
        self.{name} = [{keep} for p in params]  # STORE

    def copy_to(self, params):
        for s, p in zip(self.shadow, params):
            p.data.copy_(s)

    def restore(self, params):
        for c, p in zip(self.{name}, params):
            p.data.copy_({back})  # SITE
        self.{name} = None
"""

HOST = ["p.detach().cpu().clone()", "p.cpu().clone()", 'p.detach().to("cpu").clone()', "torch.clone(p.data.cpu())"]
DEVICE = ["p.detach().clone()", "p.clone()", "p.data.clone().contiguous()"]
BACKS = ["c", "c.data", "c.to(p.device)"]


@pytest.mark.parametrize("kind", ["host", "device"])
def test_a_host_copy_sent_back_in_the_step(tmp_path, kind):
    d = random.choice([4, 6, 8])
    keep = random.choice(HOST if kind == "host" else DEVICE)
    prelude = PRELUDE.format(name=random.choice(["temp_stored_params", "backup", "_live"]), keep=keep,
                             back=random.choice(BACKS))
    step = ("        ps = list(self.lin.parameters())\n        self.ema.store(ps)\n        self.ema.copy_to(ps)\n"
            "        self.out.copy_(self.lin(self.x))\n        self.ema.restore(ps)\n        return self.out")
    tpl = module_target(prelude=prelude, init=f"        self.lin = nn.Linear({d}, {d})\n"
                        "        self.ema = Swap(self.lin.parameters())", step=step)
    path, site = write_target(tmp_path / "ema_swap.py", tpl, seed=random.randrange(2**31), d=d)
    store = write_target(tmp_path / "ema_swap.py", tpl, marker="# STORE", seed=0, d=d)[1]
    bad = blocking(path)
    if kind == "device":
        assert not len(bad), table(bad)
        return
    assert set(bad.category) == {"host-sync", "pageable-copy"}, table(bad)
    assert list(at(bad, "pageable-copy", site).line) == [site], table(bad)
    assert f"ema_swap.py:{store}" in at(bad, "pageable-copy", site).iloc[0].message, table(bad)
    assert list(at(bad, "host-sync", store).line) == [store], table(bad)
