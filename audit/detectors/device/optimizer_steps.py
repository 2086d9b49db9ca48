"""The step counters torch.optim keeps in host memory: an optimizer's `state[p]["step"]` (and NAdam's
`mu_product`) when its group is neither `capturable` nor `fused`.

Adam, AdamW, NAdam, RAdam, Adamax, ASGD and Adagrad make that counter with `torch.tensor(0.0)` (no device)
unless the group asks for `capturable=True` or `fused=True`, and then they put it on the parameter's device.
So on a GPU the counter of a default optimizer lives on the host: `step_t += 1` runs on the CPU (a replay never
advances it), and reading it for the bias correction (`_get_value(step_t)`, an `.item()`) waits for nothing. A
CPU scan cannot see that from the tensor (every tensor is a host tensor there); torch's own rule says it.
"""

from __future__ import annotations

import torch

__all__ = ["host_steps", "optimizers"]

# the scalars torch.optim makes with `torch.tensor(...)` (no device) unless capturable or fused: the step count,
# and NAdam's running momentum product
_HOST_SCALARS = ("step", "mu_product")


def optimizers(ctx) -> list[tuple[str, torch.optim.Optimizer]]:
    """(path, optimizer) for each torch.optim optimizer reachable from the target."""
    return [(p, o) for p, o in ctx.trace.objects if isinstance(o, torch.optim.Optimizer)]


def host_steps(ctx) -> dict[int, str]:
    """Storage id -> label of each optimizer step counter that lives in host memory on a GPU too."""
    from audit.scan.snapshot.state import storage_id

    out = {}
    for path, opt in optimizers(ctx):
        for g, group in enumerate(opt.param_groups):
            if group.get("capturable") or group.get("fused"):
                continue  # torch puts the counter on the parameter's device
            for k, p in enumerate(group.get("params", ())):
                st = opt.state.get(p) if isinstance(p, torch.Tensor) else None
                for key in _HOST_SCALARS:
                    t = st.get(key) if isinstance(st, dict) else None
                    if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.numel() == 1:
                        out[storage_id(t)] = f"{path}.state[param_groups[{g}]['params'][{k}]]['{key}']"
    return out
