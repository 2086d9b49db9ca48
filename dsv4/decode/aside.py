"""The shared expert on a second stream, beside the gate and the routed experts.

At batch 1 a layer's FFN is a chain of small launches (the gate GEMV, its top-k, the routed experts'
two grouped GEMVs), none of which fills the memory pipe on its own. The shared expert reads the FFN
input and nothing the chain writes, so it can run on a side stream from that input to a join before
the sum: its weights (25 MB of FP8 on flash) stream while the chain runs.

Two custom ops, opaque to inductor, which keeps fusing around them:
- `dsv4::shared_expert_aside` forks: the side stream waits for the current stream's work so far,
  then runs the expert (fused w1 | w3, SwiGLU, w2: the same functions as `Expert.forward`).
- `dsv4::join_aside` makes the current stream wait for the side stream. It is declared as mutating
  the expert's output, so every read of that output is ordered after the wait; it writes nothing.

Memory: tensors made inside the fork are allocated while the side stream is current, and the caching
allocator hands their blocks back only to side-stream allocations; every fork begins by waiting for
the current stream, so a block the next fork reuses has no reader left on the current stream. The
input x was allocated on the current stream and is read on the side stream: the join takes it as an
argument, so it stays alive until the current stream has waited for the side stream. Under capture
the side stream joins the capture (fork and join become graph edges, its allocations go to the
graph's pool). Replays equal eager runs bit for bit: each kernel computes the same values whatever
runs beside it.

Opt-in (DSV4_ASIDE=1) with the decode kernels on and x on a GPU, until an H200 has timed it (it was
written in a session without one; dsv4/kernels/NOTES.md, session 19); the w1 | w3 rows must be stacked
(dsv4/layers/linear.fuse_rows; NVFP4 shared experts stay inline).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch
from torch import Tensor
from torch.library import custom_op

from dsv4 import kernels
from dsv4.layers.linear import Linear, linear_forward
from dsv4.layers.moe import Expert, swiglu

_SIDE: dict[int, torch.cuda.Stream] = {}


def switched_on() -> bool:
    return os.environ.get("DSV4_ASIDE", "0").strip().lower() in ("1", "true", "yes", "on")


def _side(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device, made on first use (a warmup run, before any capture)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE:
        _SIDE[index] = torch.cuda.Stream(device=index)
    return _SIDE[index]


def _view(fmt: str, quant: bool, act_dtype: torch.dtype, tensors: list[Tensor]) -> SimpleNamespace:
    """A Linear's format and tensors, as linear_forward reads them."""
    names = list(Linear.param_specs(1, 1, fmt))
    return SimpleNamespace(fmt=fmt, simulate_quant=quant, act_dtype=act_dtype, **dict(zip(names, tensors)))


def _expert(x: Tensor, w13: list[Tensor], w2: list[Tensor], fmt: str, quant: bool, limit: float,
            act: torch.dtype) -> Tensor:
    g, u = linear_forward(_view(fmt, quant, act, w13), x, torch.float32).chunk(2, dim=-1)
    return linear_forward(_view(fmt, quant, act, w2), swiglu(g, u, limit).to(act), torch.float32)


# Tagged as order-sensitive (the tag inductor gives ops that draw random numbers): the fork's place in
# the step is its meaning, and inductor's locality pass would otherwise sink it down to the join, after
# the gate and the routed experts, where nothing is left to overlap.
@custom_op("dsv4::shared_expert_aside", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def shared_expert_aside(x: Tensor, w13: list[Tensor], w2: list[Tensor], fmt: str, quant: bool,
                        limit: float, act: torch.dtype) -> Tensor:
    """The shared expert of x -> fp32, run on the side stream of x's device."""
    if not x.is_cuda:
        return _expert(x, w13, w2, fmt, quant, limit, act)
    side = _side(x.device)
    side.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(side):
        return _expert(x, w13, w2, fmt, quant, limit, act)


@shared_expert_aside.register_fake
def _(x, w13, w2, fmt, quant, limit, act):
    return x.new_empty((x.shape[0], w2[0].shape[0]), dtype=torch.float32)


@custom_op("dsv4::join_aside", mutates_args=("aside",))
def join_aside(aside: Tensor, keep: Tensor, after: Tensor) -> None:
    """The current stream waits for the side stream. `keep` (the fork's input) lives until here; `after`
    (the routed experts' sum) is computed before it, so inductor cannot pull that chain below the join."""
    if aside.is_cuda:
        torch.cuda.current_stream(aside.device).wait_stream(_side(aside.device))


@join_aside.register_fake
def _(aside, keep, after):
    return None


def applies(x: Tensor) -> bool:
    return x.is_cuda and kernels.enabled() and switched_on()


def shared_aside(expert: Expert | None, x: Tensor) -> tuple[Tensor, Tensor] | None:
    """Forks the shared expert of x [N, dim] onto the side stream: (its output, the input it reads) for
    `joined`, or None when it runs inline (no shared expert, CPU, kernels off, DSV4_ASIDE unset, rows unstacked)."""
    w13 = (getattr(expert, "fused_rows", None) or {}).get("w1+w3") if expert is not None else None
    if w13 is None or not applies(x):
        return None
    tensors = lambda lin: [getattr(lin, n) for n in Linear.param_specs(1, 1, lin.fmt)]  # noqa: E731
    y = shared_expert_aside(x, tensors(w13), tensors(expert.w2), w13.fmt, w13.simulate_quant,
                            float(expert.limit or 0), w13.act_dtype)
    return y, x


def joined(forked: tuple[Tensor, Tensor], after: Tensor) -> Tensor:
    """The forked expert's output, readable on the current stream once `after` is computed."""
    y, x = forked
    join_aside(y, x, after)
    return y
