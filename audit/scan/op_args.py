"""An op's arguments as the trace keeps them: a hashable copy with tensors replaced by a placeholder (the tensors
listed apart, in order), and the values of the 0-dim host tensors among its inputs.

Non-tensor arguments are what a CUDA graph bakes in; comparing them across steps is how a changing Python number
is found, so they are kept exactly (NaN as a string, which compares equal to itself)."""

from __future__ import annotations

import math

import torch

from audit.scan.patches import hooks
from audit.scan.snapshot import script_args

__all__ = ["TENSOR", "host_scalars", "walk"]

TENSOR = "<T>"  # placeholder for a tensor inside normalized arguments
_ATOMS = (type(None), bool, int, str)
_ATOMS_OBJ = (torch.dtype, torch.device, torch.layout, torch.memory_format)
_ATOM_TYPES = frozenset(_ATOMS + _ATOMS_OBJ)


def host_scalars(tensors: list, inputs: tuple) -> tuple:
    """(index, value) of the 0-dim CPU tensor inputs (reading one is a host read, not a sync)."""
    out = ()
    for i, m in enumerate(inputs):
        if not m.shape and m.device.type == "cpu":
            t = tensors[i]
            try:
                out += ((i, hooks.ORIG["item"](t)),)
            except Exception:  # noqa: BLE001 - a value we cannot read (meta, sparse)
                continue
    return out


def walk(a, tensors: list):
    """Normalized, hashable copy of a (nested) argument; tensors are appended to `tensors`."""
    if isinstance(a, torch.Tensor):
        tensors.append(a)
        return TENSOR
    t = type(a)
    if t in _ATOM_TYPES:
        return a
    if t is float:
        return "nan" if math.isnan(a) else a
    if t is tuple or t is list or isinstance(a, (list, tuple)):
        return tuple([x if type(x) in _ATOM_TYPES else walk(x, tensors) for x in a])
    if isinstance(a, _ATOMS):
        return a
    if isinstance(a, float):
        return "nan" if math.isnan(a) else a
    if isinstance(a, _ATOMS_OBJ):
        return a
    if isinstance(a, torch.Generator):
        return ("generator", str(a.device), hooks.is_default_generator(a))
    return script_args.value(a)
