"""torch.distributed in the step, on a one-rank gloo group (as a tensor-parallel library calls it).

A tensor collective is kernels on a stream (NCCL captures it) and `work.wait()` only orders streams: no
finding. The object collectives (pickled through a host round trip), `barrier()` and a host poll of
`work.is_completed()` wait on the host: a host-sync at the library's line, with the target's call as caller.
With one rank the object collectives may read nothing back; the call itself is the wait.
"""

from __future__ import annotations

import random

import pytest
import torch.distributed as dist

from site_util import at, blocking, library_target, matmul_target, table, write_target

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")


LIB = """
import torch
import torch.distributed as dist

def tp_reduce(t, how):
    if how == "gather_object":
        box = [None]
        dist.all_gather_object(box, t.shape[-1])  # LIBSITE
    elif how == "broadcast_object":
        dist.broadcast_object_list([{"temp": 1.0}], src=0)  # LIBSITE
    elif how == "barrier":
        dist.barrier()  # LIBSITE
    elif how == "poll":
        work = dist.all_reduce(t, async_op=True)
        while not work.is_completed():  # LIBSITE
            pass
    elif how == "wait":
        dist.all_reduce(t, async_op=True).wait()
    else:
        dist.all_reduce(t)
    if dist.get_rank() == 0:
        t = t * 1.0
    return t
"""


def _target(tmp_path, monkeypatch, how: str):
    return library_target(tmp_path, monkeypatch, LIB, "tp", "tp_reduce",
                          f'tp_reduce(torch.tanh(self.x @ self.w), "{how}")')


def _marked(lib, how: str) -> int:
    lines = lib.read_text().splitlines()
    start = next(n for n, t in enumerate(lines) if f'"{how}"' in t)
    return next(n for n, t in enumerate(lines[start:], start + 1) if "# LIBSITE" in t)


@pytest.mark.parametrize("how", ["gather_object", "broadcast_object", "barrier", "poll"])
def test_a_host_wait_of_torch_distributed_is_a_host_sync_at_the_library_line(tmp_path, monkeypatch, one_rank, how):
    mod, lib, path, site = _target(tmp_path, monkeypatch, how)
    bad = blocking(path, forget=mod)
    hit = bad[(bad.category == "host-sync") & bad.file.str.endswith(lib.name) & (bad.line == _marked(lib, how))]
    assert len(hit) == 1 and len(bad) == 1, table(bad)
    assert hit.iloc[0].caller_file.endswith(path.name) and int(hit.iloc[0].caller_line) == site


@pytest.mark.parametrize("how", ["all_reduce", "wait"])
def test_a_tensor_collective_and_a_stream_wait_are_no_finding(tmp_path, monkeypatch, one_rank, how):
    mod, lib, path, site = _target(tmp_path, monkeypatch, how)
    bad = blocking(path, forget=mod)
    assert not len(bad), table(bad)


OWN = matmul_target(imports="import torch.distributed as dist", step="""        h = torch.tanh(self.x @ self.w)
        dist.barrier()  # SITE
        self.out.copy_(h)
        return self.out""")


def test_own_barrier_is_a_host_sync(tmp_path, one_rank):
    path, site = write_target(tmp_path / "own_barrier.py", OWN, seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path)
    assert len(at(bad, "host-sync", site)) == 1, table(bad)
