"""The learned MoE gate kernel (dsv4/kernels/_triton_gate.py) on the CPU through Triton's interpreter, against
its twin (dsv4/ops/gate.py), and the gate wired through its op against the plain torch routing."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from test_triton_interpret import _interpret


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton not installed (its interpreter runs the kernels)")
def test_gate_kernel_is_the_twin():
    """The same experts in the same (index) order as the twin, ties at the k-th biased score to the lowest
    indices (rows built with repeated values), logits above softplus's threshold of 20, E not a power of
    two; the weights within an fp32 rounding of the twin's and summing to route_scale."""
    _interpret('''
        from dsv4.kernels import _triton_gate as K
        from dsv4.ops.gate import moe_gate_ref
        for N, E, k in ((1, 32, 6), (3, 20, 4), (2, 256, 8), (4, 16, 16)):
            for trial in range(3):
                logits = torch.randn(N, E, generator=g) * 4
                logits[:, : E // 4] = 25 + torch.randn(N, E // 4, generator=g)  # past the threshold: x itself
                bias = torch.randn(E, generator=g) * 0.1
                if trial == 2:  # ties: a few values repeated across the row, bias zero
                    logits = torch.randint(0, 3, (N, E), generator=g).float()
                    bias = torch.zeros(E)
                wa, ia = moe_gate_ref(logits, bias, k, 1.5)
                wb, ib = K.moe_gate(logits, bias, k, 1.5)
                assert torch.equal(ia, ib), (N, E, k, trial, ia, ib)
                assert torch.allclose(wa, wb, rtol=1e-6, atol=0), (wa - wb).abs().max()  # a few fp32 ulp
                assert torch.allclose(wb.sum(-1), torch.full((N,), 1.5), rtol=1e-6)
    ''')


def test_learned_gate_through_its_op_routes_as_the_torch_path(rng, monkeypatch):
    """Gate.forward with the gate op (as on CUDA with the kernels on; here its CPU twin) picks the experts the
    torch path picks, with the same weights, in index order; hash gates keep the torch path."""
    import dsv4
    from dsv4 import kernels
    from dsv4.kernels import ops

    model = dsv4.load("tiny", dtype="bfloat16", seed=int(torch.randint(0, 999, (1,), generator=rng)))
    calls = [0]
    real = ops.moe_gate
    monkeypatch.setattr(ops, "moe_gate", lambda *a: calls.__setitem__(0, calls[0] + 1) or real(*a))
    for layer in model.layers:
        gate = layer.ffn.gate
        if not gate.hash:
            with torch.no_grad():
                gate.bias.copy_(torch.randn(gate.bias.shape, generator=rng) * 0.1)
        x = torch.randn(5, model.cfg.dim, generator=rng).bfloat16()
        ids = torch.randint(0, model.cfg.vocab_size, (5,), generator=rng)
        monkeypatch.setattr(kernels, "_applies", lambda t: False)
        w0, i0 = gate(x, ids)
        monkeypatch.setattr(kernels, "_applies", lambda t: True)
        before = calls[0]
        w1, i1 = gate(x, ids)
        assert calls[0] == before + (0 if gate.hash else 1)
        if gate.hash:
            assert torch.equal(i0, i1) and torch.equal(w0, w1)
            continue
        order = i0.argsort(-1)
        assert torch.equal(i0.gather(-1, order), i1)  # the op's picks come in index order
        assert torch.allclose(w0.gather(-1, order), w1, rtol=1e-6, atol=0)
