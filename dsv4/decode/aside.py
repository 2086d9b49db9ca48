"""Work that reads only a layer's input, on a second stream beside the chain that follows it.

At batch 1 a layer is a chain of small launches, none of which fills the memory pipe on its own. Two
pieces read only the sub-layer's input and nothing of the chain, so they can run on a side stream from
that input to a join just before their output is read:
- the shared expert (its weights, 25 MB of FP8 on flash, stream while the gate, its top-k and the routed
  experts run); the join is before the sum with the routed experts;
- a compressed layer's compressors (their bf16 wkv | wgate GEMV and one-launch step, which write the
  compressed caches), beside the attention entry and the indexer's queries; the join is before the
  indexer's scores or, without an indexer, before the sparse attention.

Custom ops, opaque to inductor, which keeps fusing around them:
- a fork (`shared_expert_aside`, `compressor_aside`): the side stream waits for the current stream's
  work so far, then runs the piece with the same functions as the inline path (`linear_forward`,
  `swiglu`, `kernels.compress_token`). Inductor's post-grad locality pass moves a node down next to its
  first consumer, and it sank a fork to the join, where nothing is left to overlap. A fork's outputs are
  read through `getitem` nodes (a compressor's mutated state, the shared expert's one-element list),
  which that pass never moves, so the fork stays next to them, where the step issues it; it also carries
  the `nondeterministic_seeded` tag, which torch 2.13's pass leaves in place (random ops keep their
  order) and torch 2.11's does not: there a shared expert fork returning a bare tensor landed below the
  gate's GEMV, and returned in a list it stays above it (measured on the GPU machine's torch 2.11);
- `join_aside`: the current stream waits for the side stream. It is declared as mutating the forked
  outputs, so every later read of them is ordered after the wait (inductor reinplaces it: no copy), and
  it takes the chain's own results (`after`), which the same pass would otherwise pull below it.

Memory: tensors made inside a fork are allocated while the side stream is current, and the caching
allocator hands their blocks back only to side-stream allocations; every fork begins by waiting for the
current stream, so a block the next fork reuses has no reader left on the current stream. The fork's
input was allocated on the current stream and is read on the side stream: the join takes it (`keep`), so
it stays alive until the current stream has waited. Under capture the side stream joins the capture
(fork and join become graph edges, its allocations go to the graph's pool). The intent was replays equal
to eager runs bit for bit (each kernel computes the same values whatever runs beside it); the H200 says
otherwise (below), so one of these assumptions fails under capture.

Off by default and NOT replay-safe: on the H200 (dsv4/kernels/NOTES.md, session 20) a full graph with the
forks differed from its eager run at the first step (NaN in a layer's state at batch 1, the logits at batch
16), and the step was slower (8.18 ms against 6.98 inline, flash-h200, batch 1, ctx 1024). Opting in warns.
It needs the decode kernels on and the input on a GPU; the rows read together must be stacked (w1 | w3,
wkv | wgate: dsv4/layers/linear.fuse_rows), and a compressor forks only where its
one-launch step applies; elsewhere the pieces run inline.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from types import SimpleNamespace

import torch
from torch import Tensor
from torch.library import custom_op

from dsv4 import kernels
from dsv4.layers.compressor import Compressor
from dsv4.layers.linear import Linear, linear_forward
from dsv4.layers.moe import Expert, swiglu

_SIDE: dict[int, torch.cuda.Stream] = {}


def switched_on() -> bool:
    on = os.environ.get("DSV4_ASIDE", "0").strip().lower() in ("1", "true", "yes", "on")
    if on:
        warnings.warn("DSV4_ASIDE=1: the side-stream forks are not replay-safe (a graph replay differed from "
                      "eager on the H200) and were slower; see dsv4/decode/aside.py", RuntimeWarning, stacklevel=2)
    return on


def _side(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device, made on first use (a warmup run, before any capture)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE:
        _SIDE[index] = torch.cuda.Stream(device=index)
    return _SIDE[index]


@contextlib.contextmanager
def _on_side(device: torch.device):
    """Work issued inside runs on the device's side stream, after everything issued so far on the current one."""
    if device.type != "cuda":
        yield
        return
    side = _side(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        yield


def _tensors(lin) -> list[Tensor]:
    return [getattr(lin, n) for n in Linear.param_specs(1, 1, lin.fmt)]


def _view(fmt: str, quant: bool, act_dtype: torch.dtype, tensors: list[Tensor]) -> SimpleNamespace:
    """A Linear's format and tensors, as linear_forward reads them."""
    names = list(Linear.param_specs(1, 1, fmt))
    return SimpleNamespace(fmt=fmt, simulate_quant=quant, act_dtype=act_dtype, **dict(zip(names, tensors)))


def _expert(x: Tensor, w13: list[Tensor], w2: list[Tensor], fmt: str, quant: bool, limit: float,
            act: torch.dtype) -> Tensor:
    g, u = linear_forward(_view(fmt, quant, act, w13), x, torch.float32).chunk(2, dim=-1)
    return linear_forward(_view(fmt, quant, act, w2), swiglu(g, u, limit).to(act), torch.float32)


ORDERED = (torch.Tag.nondeterministic_seeded,)  # the fork stays where the step issues it (module docstring)


@custom_op("dsv4::shared_expert_aside", mutates_args=(), tags=ORDERED)
def shared_expert_aside(x: Tensor, w13: list[Tensor], w2: list[Tensor], fmt: str, quant: bool,
                        limit: float, act: torch.dtype) -> list[Tensor]:
    """[the shared expert of x -> fp32], run on the side stream of x's device (a list: module docstring)."""
    with _on_side(x.device):
        return [_expert(x, w13, w2, fmt, quant, limit, act)]


@shared_expert_aside.register_fake
def _(x, w13, w2, fmt, quant, limit, act):
    return [x.new_empty((x.shape[0], w2[0].shape[0]), dtype=torch.float32)]


@custom_op("dsv4::compressor_aside", mutates_args=("both", "out"), tags=ORDERED)
def compressor_aside(x: Tensor, pos: Tensor, w: list[Tensor], quant: bool, act: torch.dtype, ape: Tensor,
                     norm: Tensor, eps: float, freqs: Tensor, rounding: str, ratio: int, overlap: bool,
                     both: Tensor, out: Tensor) -> None:
    """One compressor's decode step of x [B, 1, dim] (its state `both` and cache `out` written in place), run
    on the side stream: the wkv | wgate GEMV, then the one-launch step (`kernels.compress_token`)."""
    with _on_side(x.device):
        kv, z = linear_forward(_view("bf16", quant, act, w), x, torch.float32).chunk(2, dim=-1)
        ran = kernels.compress_token(kv[:, 0], z[:, 0], both, pos, out, ratio, overlap, norm, eps, freqs, rounding,
                                     ape=ape)
    if not ran:
        raise RuntimeError("compressor_aside: the one-launch step does not apply (checked before the fork)")


@compressor_aside.register_fake
def _(x, pos, w, quant, act, ape, norm, eps, freqs, rounding, ratio, overlap, both, out):
    return None


@custom_op("dsv4::join_aside", mutates_args=("done",))
def join_aside(done: list[Tensor], keep: list[Tensor], after: list[Tensor]) -> None:
    """The current stream waits for the side stream: `done` (what the forks wrote) is readable after this.
    `keep` (the forks' inputs) lives until here; `after` (the chain's own results) is computed before it."""
    if done and done[0].is_cuda:
        torch.cuda.current_stream(done[0].device).wait_stream(_side(done[0].device))


@join_aside.register_fake
def _(done, keep, after):
    return None


def applies(x: Tensor) -> bool:
    return x.is_cuda and kernels.enabled() and switched_on()


def shared_aside(expert: Expert | None, x: Tensor) -> tuple[Tensor, Tensor] | None:
    """Forks the shared expert of x [N, dim] onto the side stream: (its output, the input it reads) for
    `joined`, or None when it runs inline (no shared expert, CPU, kernels off, DSV4_ASIDE unset, rows unstacked)."""
    w13 = (getattr(expert, "fused_rows", None) or {}).get("w1+w3") if expert is not None else None
    if w13 is None or not applies(x):
        return None
    (y,) = shared_expert_aside(x, _tensors(w13), _tensors(expert.w2), w13.fmt, w13.simulate_quant,
                               float(expert.limit or 0), w13.act_dtype)
    return y, x


def joined(forked: tuple[Tensor, Tensor], after: Tensor) -> Tensor:
    """The forked expert's output, readable on the current stream once `after` is computed."""
    y, x = forked
    join_aside([y], [x], [after])
    return y


def compressors_aside(comps: list[Compressor], states: list, outs: list[Tensor], x: Tensor, pos: Tensor) -> bool:
    """Forks the decode step of every compressor in `comps` (its state, its cache) onto the side stream when
    all of them can (see the module docstring); False: none forked, the caller runs them inline."""
    if not applies(x):
        return False
    rows = [(getattr(c, "fused_rows", None) or {}).get("wkv+wgate") for c in comps]
    if any(r is None for r in rows) or not all(
            kernels.compress_token_applies(st.both, out, c.ratio, c.overlap, c.freqs, c.rounding)
            for c, st, out in zip(comps, states, outs)):
        return False
    for c, r, st, out in zip(comps, rows, states, outs):
        compressor_aside(x, pos, _tensors(r), r.simulate_quant, r.act_dtype, c.ape, c.norm.weight, c.norm.eps,
                         c.freqs, c.rounding, c.ratio, c.overlap, st.both, out)
    return True
