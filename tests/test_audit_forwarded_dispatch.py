"""An op a tensor subclass's dispatch forwards to its inner data is one finding, at the wrapper's call.

PyG's `EdgeIndex` (a wrapper around a [2, E] index tensor with cached metadata) runs `edge_index[:, mask]`
through its `__torch_dispatch__`, which calls the same `aten.index` on its `_data` and rewraps the result. The
scan traces that body, so the one bool-mask read and its varying shape were reported twice: at the library
line that indexed the wrapper and at the subclass's forwarding line. The forwarded copy is left out; an op
the body adds of its own (a `torch.nonzero` to cache the nonzero rows) is still reported at its line. Nor is the
wrapper's call downstream of its own body: its varying shape is an origin even where a caller passes a size.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, marked_line, module_target, table, write_target

LIB = """
import torch

aten = torch.ops.aten


class Edges(torch.Tensor):
    @staticmethod
    def __new__(cls, data):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

    def __init__(self, data):
        self._data = data

    def __tensor_flatten__(self):
        return ["_data"], None

    @classmethod
    def __tensor_unflatten__(cls, inner, meta, size, stride):
        return cls(inner["_data"])

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is aten.index.Tensor and isinstance(args[0], Edges):
            out = aten.index.Tensor(args[0]._data, args[1])  # FORWARD
            {extra}
            return Edges(out)
        args = [a._data if isinstance(a, Edges) else a for a in args]
        return func(*args, **(kwargs or {{}}))


def drop_loops(edge_index, n_edges):
    mask = edge_index[0] != edge_index[1]
    return edge_index[:, mask]  # LIBSITE


def degree(edge_index, n):
    kept = drop_loops(Edges(edge_index), edge_index.size(1))
    return torch.zeros(n).index_add_(0, kept[1], torch.ones(kept.shape[1]))
"""

TARGET = module_target(imports="import {mod} as lib", init="""\
        self.edges = torch.zeros(2, {e}, dtype=torch.long)
        self.gen = torch.Generator().manual_seed({seed})""", prepare="""\
        ei = torch.randint(0, {d}, (2, {e}), generator=self.gen)
        ei[1] = (ei[0] + 1) % {d}
        ei[1, : i % 3] = ei[0, : i % 3]
        self.edges.copy_(ei)""", step="""\
        self.out.copy_(lib.degree(self.edges, {d})[None])  # SITE
        return self.out""")


@pytest.mark.parametrize("kind", ["forwarded", "own_nonzero"])
def test_a_forwarded_op_is_reported_once_at_the_wrapper_call(tmp_path, monkeypatch, kind):
    extra = "torch.nonzero(out[0] >= 0)  # OWN" if kind == "own_nonzero" else "pass"
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(extra=extra), prefix="edges")
    path, site = write_target(tmp_path / "target" / "edges_target.py", TARGET, mod=mod, seed=random.randrange(2**31),
                              d=random.choice([6, 8]), e=random.choice([12, 16]))
    bad = blocking(path, forget=mod)
    call, forward = marked_line(lib, "# LIBSITE"), marked_line(lib, "# FORWARD")
    for category in ("host-sync", "dynamic-shape"):
        rows = bad[bad.category == category]
        assert call in set(rows.line) and forward not in set(rows.line), table(bad)
    own = bad[(bad.category == "host-sync") & (bad.op == "aten.nonzero")]
    assert len(own) == (kind == "own_nonzero"), table(bad)
    if kind == "own_nonzero":
        assert own.iloc[0].line == marked_line(lib, "# OWN") and own.iloc[0].caller_line == site, table(bad)
