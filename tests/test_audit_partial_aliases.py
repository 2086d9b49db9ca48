"""A wait bound at import inside a `functools.partial` (`_bcast = partial(dist.broadcast_object_list, src=0)`,
`_sync = partial(torch.cuda.synchronize)`) is the same binding as `from torch.cuda import synchronize`: the scan
patches it too, so the call is one host-sync at the library's line (not the object collective's insides
traced as the step's own ops, nor a CPU-only torch raising), with the target's call as caller."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, library_hit, library_target, table


LIB = """
import functools
import torch
import torch.distributed as dist

_bcast = functools.partial(dist.broadcast_object_list, src=0)
_gather = functools.partial(dist.all_gather_object)
_sync = functools.partial(torch.cuda.synchronize)

def share(x, how):
    y = torch.tanh(x) * {k}
    if how == "bcast":
        _bcast([{{"rows": y.shape[0]}}])  # LIBSITE-bcast
    elif how == "gather":
        _gather([None], y.shape[-1])  # LIBSITE-gather
    elif how == "sync":
        _sync()  # LIBSITE-sync
    return y
"""


@pytest.mark.parametrize("how", ["bcast", "gather", "sync", "none"])
def test_a_wait_bound_in_a_partial_is_one_host_sync(tmp_path, monkeypatch, one_rank, how):
    src = LIB.replace("{k}", str(random.choice([1, 2, 3]))).replace("{{", "{").replace("}}", "}")
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "partials", "share",
                                          f'share(self.x @ self.w, "{how}")')
    bad = blocking(path, forget=mod)
    if how == "none":
        assert not len(bad), table(bad)
        return
    library_hit(bad, "host-sync", lib, path, site, marker=f"# LIBSITE-{how}")
    assert len(bad) == 1, table(bad)
