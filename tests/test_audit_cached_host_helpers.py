"""pageable-copy: a host tensor a cached helper returns, moved to the device in the step.

`@functools.lru_cache def window(n): return torch.hann_window(n)` then `window(n).to(x.device)` in forward: the
helper made its tensor in host memory once, in warmup, so no op of the audited steps made it; on a GPU every
call copies it from pageable memory, which capture refuses. The source of the helper says where its tensor
lives. The twin caches the tensor on the device (`helper_on(n, device)` building it with `device=device`): clean."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, module_target, write_target

LIB = """
import functools

import numpy as np
import torch
from torch import nn

_MEMO = {{}}


{deco}
def {fn}(n):
    return {host}


{deco}
def {fn}_on(n, device):
    return torch.{factory}(n, device=device)


class Front(nn.Module):
    def __init__(self, n, on_device):
        super().__init__()
        self.n, self.on_device = n, on_device

    def forward(self, x):
        if self.on_device:
            return x * {fn}_on(self.n, x.device)
        {body}
"""

HOST = {"ones": "torch.ones(n)", "hann_window": "torch.from_numpy(np.hanning(n).astype(np.float32))"}
BODY = ["return x * {fn}(self.n).to(x.device)  # LIBSITE",
        "w = {fn}(self.n)\n        return x * w.to(x.device, non_blocking=True)  # LIBSITE"]


@pytest.mark.parametrize("kind", ["clean", "hit"])
def test_cached_host_tensor_moved_per_call_is_a_pageable_copy(tmp_path, monkeypatch, kind):
    fn = random.choice(["window", "host_table", "_filters"])
    factory = random.choice(list(HOST))
    deco = random.choice(["@functools.lru_cache(maxsize=None)", "@functools.cache", "@functools.lru_cache(maxsize=4)"])
    body = random.choice(BODY).format(fn=fn)
    d = random.choice([4, 8])
    src = LIB.format(deco=deco, fn=fn, factory=factory, host=HOST[factory], body=body)
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="cachedhost")
    tpl = module_target(imports=f"from {mod} import Front",
                        init=f"        self.fe = Front({d}, {kind == 'clean'})",
                        step="        y = self.fe(self.x)  # SITE\n        self.out.copy_(y)")
    path, site = write_target(tmp_path / "target" / "cachedhost.py", tpl, seed=random.randrange(2**31), d=d)
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "pageable-copy", lib, path, site)
