"""Small tensors a module keeps at module level in host memory.

A library keeps a table or a counter as a module global made at import by a host factory (`_DEFAULT_SPLITS =
torch.tensor([8])` for an all_to_all's split sizes, `_STEPS = torch.zeros(1)`): naming no device (or the CPU),
it lives in host memory on a GPU too, as a small tensor an object keeps on the host on purpose does. Reading it
back (`_DEFAULT_SPLITS.tolist()`) waits for nothing; advancing it in place is host bookkeeping. Only the modules
whose code the step ran are read, and only module-level assignments, every one of which must be such a factory.
"""

from __future__ import annotations

import ast

import torch

from audit.detectors.source import mutations
from audit.scan.sources import loaded

__all__ = ["host_globals"]


def host_globals(ctx, any_size: bool = False) -> dict[int, str]:
    """Storage id -> 'module.NAME' of the small CPU tensors (at most 1-dim, 64 elements; of any size with
    `any_size`, for reads: a table of image grids) that the modules the step ran code in bind at module level to
    a host factory's result."""
    from audit.scan.snapshot import state

    files = {code.co_filename for recs in ctx.steps for r in recs for code, _ in r.stack}
    out = {}
    for name, mod, file in loaded.with_files():
        if file not in files:
            continue
        for g in _made_on_host(file):
            t = vars(mod).get(g)
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and (
                    any_size or (t.dim() <= 1 and t.numel() <= 64)):
                out[state.storage_id(t)] = f"{name}.{g}"
    return out


def _made_on_host(file: str) -> list[str]:
    """The global names every module-level assignment of which is a host factory (`torch.tensor([8])`,
    `torch.zeros(4, dtype=torch.long)`, `torch.arange(8) * 2`)."""
    t = mutations.tree(file)
    kinds: dict[str, bool] = {}
    for node in t.body if t is not None else ():
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for x in targets:
            if isinstance(x, ast.Name):
                host = mutations._host_factory(file, node.value) or mutations._host_computed(file, node.value)
                kinds[x.id] = kinds.get(x.id, True) and host
    return [n for n, host in kinds.items() if host]
