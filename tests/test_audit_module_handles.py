"""A module global rebound in the step to another object that is neither plain data nor a user object (an async
collective's Work handle kept for the next step, `_PENDING = dist.all_reduce(out, async_op=True)`; a fresh
torch.Generator) is Python state a replay never rebinds: cpu-side-effect at the assignment, with the target's
call as caller. One made once, on the first call (warmup), is no finding."""

from __future__ import annotations

import random

import pytest
import torch.distributed as dist

from site_util import blocking, library_hit, library_target, table

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")


LIB = """
import threading
import torch
import torch.distributed as dist

_PENDING = None
_DONE = None
_GEN = None

def reduce(x, how):
    global _PENDING, _DONE, _GEN
    out = torch.tanh(x) * {k}
    if how == "work":
        _PENDING = dist.all_reduce(out, async_op=True)  # LIBSITE-work
        _PENDING.wait()
    elif how == "generator":
        _GEN = torch.Generator()  # LIBSITE-generator
    elif how == "once":
        if _DONE is None:
            _DONE = threading.Event()
        dist.all_reduce(out)
    return out
"""


@pytest.mark.parametrize("how", ["work", "generator", "once"])
def test_a_module_global_rebound_to_a_new_object_is_state(tmp_path, monkeypatch, one_rank, how):
    src = LIB.replace("{k}", str(random.choice([1, 2, 3])))
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "handles", "reduce",
                                          f'reduce(self.x @ self.w, "{how}")')
    bad = blocking(path, forget=mod)
    if how == "once":
        assert not len(bad), table(bad)
        return
    library_hit(bad, "cpu-side-effect", lib, path, site, marker=f"# LIBSITE-{how}")
    assert len(bad) == 1, table(bad)
