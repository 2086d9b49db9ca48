"""Graph-ready MoE: every (token, slot) pair gathers its expert's weights by device index.

The reference dispatch asks the host how many tokens each expert got; here the shapes are fixed
at tokens x top-k whatever the routing: expert weights are stacked once into [E, ...] banks (the
experts' parameters become views into the banks, so memory is not duplicated), each pair's
weights are gathered by its expert id, dequantized and applied with a batched matmul.

On a tensor-parallel rank (dsv4/decode/parallel.py) the banks hold only the local experts. A
device table maps global expert ids to bank rows; a pair routed to another rank's expert gathers
bank row 0 and gets routing weight 0 (applied before w2, so it adds exactly zero). Shapes stay
tokens x top-k, so the step stays graph-ready; the waste is (world-1)/world of the routed GEMVs.
"""

from __future__ import annotations

import torch
from torch import nn

from dsv4 import kernels
from dsv4.decode.aside import joined, shared_aside
from dsv4.layers.linear import Linear
from dsv4.layers.moe import MoE, swiglu
from dsv4.ops import quantize as Q


@torch.no_grad()
def stack_bank(linears: list[Linear]) -> dict[str, torch.Tensor]:
    """Stacks the experts' tensors and rebinds each expert's parameters to views of the stack."""
    bank = {}
    for name in Linear.param_specs(linears[0].in_features, linears[0].out_features, linears[0].fmt):
        parts = [getattr(lin, name) for lin in linears]
        base = parts[0].untyped_storage().data_ptr()
        contiguous = all(p.untyped_storage().data_ptr() == base for p in parts)
        stacked = torch.stack([p.data for p in parts]) if not contiguous else _as_stack(parts)
        for e, lin in enumerate(linears):
            setattr(lin, name, nn.Parameter(stacked[e], requires_grad=False))
        bank[name] = stacked
    return bank


def _as_stack(parts: list[torch.Tensor]) -> torch.Tensor:
    """Experts already views of one bank (a second StaticDecoder over the same model); the step
    between experts is read from their offsets (a w1 | w3 bank spaces them two projections apart)."""
    first = parts[0]
    step = parts[1].storage_offset() - first.storage_offset() if len(parts) > 1 else first.numel()
    return first.as_strided((len(parts), *first.shape), (step, *first.stride()), first.storage_offset())


@torch.no_grad()
def stack_w13(linears1: list[Linear], linears3: list[Linear], b1: dict, b3: dict) -> dict[str, torch.Tensor] | None:
    """One [E, 2N, ...] bank of w1 rows then w3 rows per expert, so the two projections of the routed
    experts are one grouped launch; the w1/w3 banks and the experts' parameters become views of it.
    None for NVFP4 (w1 and w3 carry different global scales)."""
    if "global_scale" in b1:
        return None
    bank = {}
    for name in b1:
        N = b1[name].shape[1]
        a = b1[name]
        if a.untyped_storage().data_ptr() == b3[name].untyped_storage().data_ptr() and \
                b3[name].storage_offset() == a.storage_offset() + a.stride(1) * N and a.stride(0) == 2 * N * a.stride(1):
            w13 = a.as_strided((a.shape[0], 2 * N, *a.shape[2:]), a.stride(), a.storage_offset())  # already one
        else:
            w13 = torch.cat((a, b3[name]), dim=1)
        for lins, lo, b in ((linears1, 0, b1), (linears3, N, b3)):
            for e, lin in enumerate(lins):
                setattr(lin, name, nn.Parameter(w13[e, lo:lo + N], requires_grad=False))
            b[name] = w13[:, lo:lo + N]
        bank[name] = w13
    return bank


def dequantize_bank(fmt: str, bank: dict[str, torch.Tensor], idx: torch.Tensor) -> torch.Tensor:
    """fp32 weights [n, out, in] of experts idx [n]."""
    w = bank["weight"].index_select(0, idx)
    if fmt == "bf16":
        return w.float()
    s = bank["scale"].index_select(0, idx)
    if fmt == "fp8":
        return Q.dequantize_fp8_blockwise(w, s)
    if fmt == "fp4":
        return Q.dequantize_fp4(w, s)
    return Q.dequantize_nvfp4(w, s, bank["global_scale"].index_select(0, idx)[:, None, None])


class StaticMoE:
    def __init__(self, moe: MoE):
        self.moe = moe
        experts = list(moe.experts)
        self.fmt = experts[0].w1.fmt
        self.template = experts[0]
        self.banks = {w: stack_bank([getattr(e, w) for e in experts]) for w in ("w1", "w3", "w2")}
        w13 = stack_w13([e.w1 for e in experts], [e.w3 for e in experts], self.banks["w1"], self.banks["w3"])
        if w13 is not None:
            self.banks["w13"] = w13
        self.local_of = _local_table(moe, self.banks["w1"]["weight"].device)

    def expert_linear(self, which: str, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """x [n, in] through expert idx[i]'s projection `which` -> fp32 [n, out]."""
        lin: Linear = getattr(self.template, "w1" if which == "w13" else which)
        x = x.to(lin.act_dtype)
        if lin.simulate_quant and kernels.expert_rounds_in_kernel(self.fmt, x):  # rounding in the kernel
            y = kernels.expert_gemv(self.fmt, x, self.banks[which], idx, quant=True)
            if y is not None:
                return y
        xq = lin.quantize_input(x)
        y = kernels.expert_gemv(self.fmt, xq, self.banks[which], idx)  # None: switch off, CPU, ...
        if y is not None:
            return y
        w = dequantize_bank(self.fmt, self.banks[which], idx)
        return torch.bmm(w, xq.float().unsqueeze(-1)).squeeze(-1)

    def __call__(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        moe, ex = self.moe, self.template
        shape = x.shape
        x, ids = x.flatten(0, -2), ids.flatten()
        forked = shared_aside(moe.shared_experts, x)  # the shared expert beside the routed ones, or None
        weights, idx = moe.gate(x, ids)
        N, k = idx.shape
        xr = x.unsqueeze(1).expand(N, k, x.shape[-1]).reshape(N * k, -1)
        flat, w = idx.flatten(), weights.reshape(-1, 1)
        if self.local_of is not None:  # expert parallel: another rank's expert -> row 0, weight 0
            local = self.local_of[flat]
            w = w * (local >= 0).unsqueeze(-1)
            flat = local.clamp(min=0)
        if "w13" in self.banks:  # one grouped launch for both projections
            g, u = self.expert_linear("w13", xr, flat).chunk(2, dim=-1)
        else:
            g, u = self.expert_linear("w1", xr, flat), self.expert_linear("w3", xr, flat)
        a = swiglu(g, u, ex.limit) * w
        y = self.expert_linear("w2", a.to(ex.act_dtype), flat).view(N, k, -1).sum(1)
        if forked is not None:
            y = y + joined(forked, after=y)
        elif moe.shared_experts is not None:
            y = y + moe.shared_experts(x)
        return moe.reduce(y).to(moe.act_dtype).view(shape)


def _local_table(moe: MoE, device) -> torch.Tensor | None:
    """global expert id -> bank row (-1: held by another rank); None when this rank holds them all."""
    ids = list(moe.expert_ids)
    if len(ids) == moe.n_experts:
        return None
    table = torch.full((moe.n_experts,), -1, dtype=torch.int64)
    table[torch.tensor(ids)] = torch.arange(len(ids))
    return table.to(device)
