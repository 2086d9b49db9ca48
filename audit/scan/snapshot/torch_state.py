"""torch's own training-state objects, whose Python attributes are step state like a user object's.

A training step captured whole runs `opt.step()` and `sched.step()`: an LR scheduler advances
`last_epoch` and writes `group["lr"]`, an optimizer keeps its hyperparameters in `param_groups`.
Those are plain Python values a replay never changes, yet they live in objects of torch's classes,
which the state snapshot otherwise leaves alone (torch's modules hold no step state of the target's).
So does torch's data-loading machinery: a DataLoader's iterator advanced in the step keeps its position in
`_num_yielded` and its sampler's generator, and the dataset it reads holds the tensors a batch is made from
(host memory the step may send to the device), reached only through the DataLoader.
"""

from __future__ import annotations

import types

from audit.scan.snapshot.own_dict import has_own_dict

__all__ = ["is_training_state"]

_MODULES = ("torch.optim.", "torch.amp.grad_scaler", "torch.cuda.amp.grad_scaler", "torch.profiler.", "torch.utils.data.")


def is_training_state(v) -> bool:
    """An instance of a class torch defines for training state: an optimizer, an LR scheduler, a
    gradient scaler; or for data loading: a DataLoader, its iterator, a dataset or sampler (user subclasses are user
    objects anyway)."""
    mod = getattr(type(v), "__module__", "") or ""
    return has_own_dict(v) and not isinstance(v, _NOT_STATE) and mod.startswith(_MODULES)


_NOT_STATE = (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType)
