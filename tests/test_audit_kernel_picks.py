"""A torch call that picks kernels by shape below any Python code is no branch of the step's code.

On a GPU, `F.scaled_dot_product_attention` with a boolean mask whose key length is not aligned pads the mask
(`constant_pad_nd`), slices it back (`slice` up to the key length) and runs the memory-efficient kernel; aligned
lengths go straight in. A cache that grows a token a step runs those ops in some steps only. A CPU build takes
another path, so the two steps' records are built here as a GPU scan leaves them: extra ops of one statement,
reading a mask of a width the other step never read, are a pick (no data-dependent-control); the same extra ops on
a line with a conditional expression stay a fork, as do extra ops on inputs of the shapes the other step read. The
slice's end, which moves while the padded mask keeps its width, follows the mask's varying width (no
baked-host-value, no dynamic-shape origin). The gpu test scans such an attention on CUDA."""

from __future__ import annotations

import random
import types

import pytest
import torch

from audit.detectors.branches.layout_picks import picked_by_layout
from audit.detectors.tensors import composite_layouts
from audit.scan.records import OpRecord, TensorMeta
from site_util import at, table, write_target

LINES = """
import torch.nn.functional as F


def attend(q, k, v, m, flag):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    alt = F.scaled_dot_product_attention(q, k, v, attn_mask=m) if flag else q
    return out, alt
"""


def _meta(*shape):
    return TensorMeta(tuple(shape), (), torch.float32, torch.device("cuda", 0), 0, 0, 0)


def _code(tmp_path):
    path = tmp_path / "attend.py"
    path.write_text(LINES)
    ns: dict = {}
    exec(compile(LINES, str(path), "exec"), ns)
    return ns["attend"].__code__


def _rec(step, index, op, stack, *inputs, args=()):
    return OpRecord(step=step, index=index, kind="aten", op=op, args=args, inputs=inputs, stack=stack)


def _steps(stack, heads, n_short, n_pad):
    """Step 0: the unaligned key length (pad + slice back); step 1: an aligned one, straight in."""
    q = _meta(1, heads, 1, 16)
    pad = [_rec(0, 2, "aten.constant_pad_nd", stack, _meta(1, 1, 1, n_short), args=((0, n_pad - n_short), 0)),
           _rec(0, 3, "aten.slice", stack, _meta(1, 1, 1, n_pad), args=(-1, 0, n_short))]
    ra = [_rec(0, 0, "aten.slice", stack, _meta(1, heads, 64, 16)), _rec(0, 1, "aten.slice", stack, _meta(1, heads, 64, 16))] \
        + pad + [_rec(0, 4, "aten._efficient_attention_forward", stack, q, _meta(1, heads, n_short, 16))]
    rb = [_rec(1, 0, "aten.slice", stack, _meta(1, heads, 64, 16)), _rec(1, 1, "aten.slice", stack, _meta(1, heads, 64, 16)),
          _rec(1, 2, "aten._efficient_attention_forward", stack, q, _meta(1, heads, n_pad, 16))]
    return ra, rb


def test_padding_inside_one_attention_call_is_a_pick(tmp_path):
    code = _code(tmp_path)
    n_pad = random.choice([16, 24, 32])
    n_short = n_pad - random.randint(1, 7)
    ra, rb = _steps(((code, code.co_firstlineno + 1),), random.choice([2, 4]), n_short, n_pad)
    assert picked_by_layout("delete", ra, rb, 2, 4, 2, 2)


def test_a_line_with_a_conditional_keeps_the_fork(tmp_path):
    code = _code(tmp_path)
    n_pad = random.choice([16, 24, 32])
    ra, rb = _steps(((code, code.co_firstlineno + 2),), random.choice([2, 4]), n_pad - random.randint(1, 7), n_pad)
    assert not picked_by_layout("delete", ra, rb, 2, 4, 2, 2)


def test_extra_kernels_on_shapes_the_other_step_read_keep_the_fork(tmp_path):
    code = _code(tmp_path)
    n = random.choice([16, 24, 32])
    stack = ((code, code.co_firstlineno + 1),)
    ra, rb = _steps(stack, 2, n, n)
    ra[2] = _rec(0, 2, "aten.mul", stack, _meta(1, 2, 64, 16))  # a kernel on a tensor both steps read
    assert not picked_by_layout("delete", ra, rb, 2, 4, 2, 2)


def test_the_slice_back_follows_the_mask_width(tmp_path):
    code = _code(tmp_path)
    stack = ((code, code.co_firstlineno + 1),)
    n_pad = random.choice([16, 24, 32])
    steps, recs = [], []
    for s, n in enumerate(range(n_pad - 6, n_pad - 2)):  # a key length growing by one, padded to one width
        a, _ = _steps(stack, 2, n, n_pad)
        a = [OpRecord(step=s, index=r.index, kind=r.kind, op=r.op, args=r.args, inputs=r.inputs, stack=r.stack)
             for r in a]
        steps.append(a)
        recs.append(a[3])
    ctx = types.SimpleNamespace(steps=steps)
    assert composite_layouts.follows_operand_layout(ctx, recs)


GPU_TARGET = """
import torch
import torch.nn.functional as F

H, D, N = {heads}, 64, 96


class Target:
    def __init__(self, device):
        self.k = torch.zeros(1, H, N, D, device=device, dtype=torch.float16)
        self.v = torch.zeros(1, H, N, D, device=device, dtype=torch.float16)
        self.q = torch.zeros(1, H, 1, D, device=device, dtype=torch.float16)
        self.mask = torch.zeros(1, 1, 1, N, dtype=torch.bool, device=device)
        self.n = {start}

    def prepare(self, i):
        self.q.copy_(torch.randn(self.q.shape))
        self.k.copy_(torch.randn(self.k.shape))
        self.v.copy_(torch.randn(self.v.shape))
        self.mask.copy_(torch.rand(self.mask.shape) > 0.2)
        self.mask[..., 0] = True
        self.n += 1

    @torch.no_grad()
    def step(self):
        n = self.n
        k, v = self.k[:, :, :n], self.v[:, :, :n]  # SLICE
        return F.scaled_dot_product_attention(self.q, k, v, attn_mask=self.mask[..., :n])  # ATTEND

def make(device):
    return Target(device)
"""


@pytest.mark.gpu
def test_attention_on_a_growing_masked_cache_on_cuda(tmp_path):
    path, _ = write_target(tmp_path / "grow_attend.py", GPU_TARGET, "# ATTEND", heads=random.choice([2, 4]),
                           start=random.randint(20, 40))
    lines = {m: next(n for n, t in enumerate(path.read_text().splitlines(), 1) if f"# {m}" in t)
             for m in ("SLICE", "ATTEND")}
    import audit

    bad = audit.scan(f"{path}:make", device="cuda").blocking()
    assert len(at(bad, "dynamic-shape", lines["SLICE"])), table(bad)
    assert not len(at(bad, "data-dependent-control", lines["ATTEND"])), table(bad)
