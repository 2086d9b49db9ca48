"""Waits a CPU scan cannot run, read from a library's source: a wait on the side of a test of the process
group's backend against NCCL (`dist.get_backend(group) == "nccl"`; NCCL runs on CUDA only, a CPU scan's group
is gloo), and torch.distributed's host waits (`dist.barrier()`, the object collectives) on the CUDA side of a
device test. Each is a host-sync at the library line, with the target's call as caller; a test of another
backend says nothing about the GPU and is left alone."""

from __future__ import annotations

import random

import pytest
import torch.distributed as dist

from site_util import blocking, library_hit, library_target, table

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")


LIB = """
import torch
import torch.distributed as dist

def nccl_eq(x):
    dist.all_reduce(x)
    x = x * {k}
    if dist.get_backend() == "nccl":
        torch.cuda.synchronize()  # LIBSITE-nccl-eq
    return x

def nccl_in(x):
    dist.all_reduce(x)
    x = x * {k}
    if "nccl" in dist.get_backend():
        torch.cuda.current_stream().synchronize()  # LIBSITE-nccl-in
    return x

def nccl_enum(x):
    dist.all_reduce(x)
    x = x * {k}
    if dist.get_backend() != dist.Backend.NCCL:
        x = x * 1.0
    else:
        torch.cuda.synchronize()  # LIBSITE-nccl-enum
    return x

def barrier_cuda(x):
    dist.all_reduce(x)
    x = x * {k}
    if x.is_cuda:
        dist.barrier()  # LIBSITE-barrier-cuda
    return x

def object_cuda(x):
    dist.all_reduce(x)
    x = x * {k}
    if torch.cuda.is_available():
        box = [None]
        dist.all_gather_object(box, {"rows": x.shape[0]})  # LIBSITE-object-cuda
    return x

def mpi(x):
    dist.all_reduce(x)
    x = x * {k}
    if dist.get_backend() == "mpi":
        torch.cuda.synchronize()
    return x
"""


@pytest.mark.parametrize("how", ["nccl-eq", "nccl-in", "nccl-enum", "barrier-cuda", "object-cuda", "mpi"])
def test_waits_only_a_gpu_runs_are_read_from_the_source(tmp_path, monkeypatch, one_rank, how):
    src = LIB.replace("{k}", str(random.choice([0.5, 1.0, 2.0])))
    fn = how.replace("-", "_")
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "tpg", fn, f"{fn}(torch.tanh(self.x @ self.w))")
    bad = blocking(path, forget=mod)
    if how == "mpi":
        assert not len(bad), table(bad)
        return
    library_hit(bad, "host-sync", lib, path, site, marker=f"# LIBSITE-{how}")
    assert len(bad) == 1, table(bad)
