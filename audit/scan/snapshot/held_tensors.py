"""The tensors a target holds right now, each by the name a person reads (`model.cache.k`, `extras[0]`,
`opt.state[<Parameter [4, 4] float32 #...>]`), and the storage each lives in: what the detectors match a
step's allocations and inputs against.
"""

from __future__ import annotations

import torch
from torch import nn

from audit.scan.snapshot.key_text import key_text
from audit.scan.snapshot.own_dict import own_dict

__all__ = ["storage_id", "tensor_attrs"]


def tensor_attrs(objects: list[tuple[str, object]]):
    """('owner.attr', tensor) for tensors the reachable objects hold right now: parameters,
    buffers, tensor attributes and tensors in list/tuple/dict attributes (`extras[0]`)."""
    for path, obj in objects:
        pre = f"{path}." if path else ""
        items = list(own_dict(obj).items())
        if isinstance(obj, nn.Module):
            items += list(obj._parameters.items()) + list(obj._buffers.items())
        for name, v in items:
            if isinstance(v, torch.Tensor):
                yield pre + name, v
            elif isinstance(v, (list, tuple)) and len(v) <= 4096:
                yield from ((f"{pre}{name}[{i}]", x) for i, x in enumerate(v) if isinstance(x, torch.Tensor))
            elif isinstance(v, dict) and len(v) <= 4096:
                yield from ((f"{pre}{name}[{key_text(k)}]", x) for k, x in v.items() if isinstance(x, torch.Tensor))


def storage_id(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage()._cdata
    except Exception:  # noqa: BLE001 - no storage (sparse, meta, wrapper subclasses)
        return 0
