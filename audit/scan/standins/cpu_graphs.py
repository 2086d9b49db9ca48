"""CUDA-graph capture begun inside the step, on a machine without CUDA: recorded, not raised.

A library that graphs its own blocks (`with torch.cuda.graph(g):`, `torch.cuda.make_graphed_callables(m, x)`,
`g.capture_begin()`) captures inside the step. Inside the step's own capture that is a capture nested in a
capture, and each of them synchronizes the device first (`torch.cuda.graph` and `make_graphed_callables` call
`torch.cuda.synchronize()`): a host-sync at the library's line. On a CPU-only torch `torch.cuda.CUDAGraph()`
raises ("no NVIDIA driver"), which would stop the scan at that line instead. While a step runs (warmup
included) these stand in, beside audit.scan.standins.cpu_cuda's streams and events: beginning a capture is recorded
as a wait at the line that begins it, the body runs eagerly (its ops are the step's ops), a replay does
nothing (the body already ran), `make_graphed_callables` hands the callables back, `graph_pool_handle()` makes
an id (some CPU-only builds raise there too). On a GPU the real calls run and audit.scan.patches.hooks records their
synchronize.
"""

from __future__ import annotations

import itertools

import torch

__all__ = ["stand_ins"]

_POOLS = itertools.count(1)


class HostGraph:
    """torch.cuda.CUDAGraph without CUDA: capture_begin is a wait; replay runs nothing."""

    def __init__(self, host, *args, **kwargs):
        self._host = host
        self._pool = (0, next(_POOLS))

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        self._host.sync("CUDAGraph.capture_begin")

    def capture_end(self) -> None:
        pass

    def replay(self) -> None:
        pass  # the captured body ran eagerly inside the capture region

    def reset(self) -> None:
        pass

    def instantiate(self) -> None:
        pass

    def pool(self) -> tuple:
        return self._pool

    def enable_debug_mode(self) -> None:
        pass

    def debug_dump(self, path) -> None:
        pass

    def __repr__(self) -> str:
        return "<stand-in torch.cuda.CUDAGraph (CPU scan)>"


def _graph_context(host):
    class graph:  # noqa: N801 - stands in for the class torch.cuda.graph
        """`with torch.cuda.graph(g):` without CUDA: one wait at the `with` line, the body runs eagerly."""

        default_capture_stream = None

        def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode: str = "global"):
            self.cuda_graph = cuda_graph

        def __enter__(self):
            host.sync("torch.cuda.graph")  # synchronizes, then begins a capture on a capturing stream

        def __exit__(self, *exc) -> bool:
            return False

    return graph


def stand_ins(host) -> list:
    """(owner, name, new) for the patches `cpu_cuda.standing_in` installs for one step."""
    cuda = torch.cuda

    def make_graphed_callables(callables, sample_args, *args, **kwargs):
        host.sync("torch.cuda.make_graphed_callables")  # synchronizes, warms up and captures each callable
        return callables

    def new_graph(cls, *args, **kwargs):
        return HostGraph(host, *args, **kwargs)

    def graph_pool_handle():
        return (0, next(_POOLS))  # an opaque pool id, as HostGraph.pool() gives: no wait

    out = [(cuda, "graph", _graph_context(host)), (cuda, "make_graphed_callables", make_graphed_callables),
           (cuda, "graph_pool_handle", graph_pool_handle)]
    graphs = getattr(cuda, "graphs", None)
    if graphs is not None:
        out += [(graphs, "graph", out[0][2]), (graphs, "make_graphed_callables", make_graphed_callables),
                (graphs, "graph_pool_handle", graph_pool_handle)]
    if isinstance(getattr(cuda, "CUDAGraph", None), type):
        out.append((cuda.CUDAGraph, "__new__", new_graph))
    return out
