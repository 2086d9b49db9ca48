"""CPU side of dsv4/kernels: the twins against float64, the kernels' decode trick emulated bit for
bit, the switch, and the import discipline (no cutlass, no CUDA needed; CPU behaviour unchanged).

Fresh random data in every test (torch reseeded from the OS, seed printed); never zeros.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from dsv4 import kernels
from dsv4.ops import gemv
from dsv4.ops import quantize as Q

# Hand-written e2m1 table (code -> value): an oracle independent of quantize.py's arithmetic.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


@pytest.fixture(autouse=True)
def _fresh_torch_seed():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"torch seed {seed}")
    torch.manual_seed(seed)


@pytest.fixture(autouse=True)
def _switch_restored():
    yield
    kernels.use(None)


# ------------------------------------------------------------------ float64 oracles


def _fp4_weights64(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    u = weight.view(torch.uint8).long()
    table = torch.tensor(E2M1, dtype=torch.float64)
    vals = torch.stack((table[u & 15], table[u >> 4]), -1).flatten(-2)  # low nibble = even element
    s = torch.exp2(scale.view(torch.uint8).double() - 127.0)
    return vals * s.repeat_interleave(32, -1)


def _nvfp4_weights64(weight, scale, gscale) -> torch.Tensor:
    u = weight.view(torch.uint8).long()
    table = torch.tensor(E2M1, dtype=torch.float64)
    vals = torch.stack((table[u & 15], table[u >> 4]), -1).flatten(-2)
    s = scale.double() * gscale.double().reshape(-1, 1, 1)
    return vals * s.repeat_interleave(16, -1)


def _fp8_weights64(weight, scale) -> torch.Tensor:
    N, K = weight.shape
    s = torch.exp2(scale.view(torch.uint8).double() - 127.0)
    s = s.repeat_interleave(128, 0)[:N].repeat_interleave(128, 1)[:, :K]
    return weight.double() * s


def _relerr(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def random_fp4_bank(E, N, K, device="cpu"):
    """Random packed e2m1 bytes (every byte is a valid pair) and plausible UE8M0 scales."""
    w = torch.randint(-128, 128, (E, N, K // 2), dtype=torch.int8, device=device)
    s = torch.randint(112, 132, (E, N, K // 32), dtype=torch.uint8, device=device).view(Q.E8M0)
    return w, s


def random_nvfp4_bank(E, N, K, device="cpu"):
    w = torch.randint(-128, 128, (E, N, K // 2), dtype=torch.int8, device=device)
    s = (torch.rand(E, N, K // 16, device=device) * 400 + 0.01).to(Q.E4M3)
    g = torch.rand(E, device=device) * 1e-3 + 1e-4
    return w, s, g


def random_fp8_weight(N, K, device="cpu"):
    w = (torch.randn(N, K, device=device) * 100).clamp(-448, 448).to(Q.E4M3)
    s = torch.randint(112, 132, (-(-N // 128), -(-K // 128)), dtype=torch.uint8, device=device).view(Q.E8M0)
    return w, s


def random_x(R, K, device="cpu"):
    """Activations as the model feeds them: bf16, FP8-fake-quantized per 128 (exact values)."""
    x = torch.randn(R, K, device=device) * torch.exp2(torch.randint(-6, 6, (R, 1), device=device).float())
    return Q.fp8_fake_quant(x.to(torch.bfloat16), 128 if K % 128 == 0 else 16)


# ------------------------------------------------------------------ twins against float64


@pytest.mark.parametrize("E,N,K,R", [(8, 96, 256, 1), (16, 64, 512, 8), (4, 128, 96 + 64, 13)])
def test_fp4_twin_equals_float64(E, N, K, R):
    w, s = random_fp4_bank(E, N, K)
    idx = torch.randint(0, E, (R,))
    x = random_x(R, K)
    y = gemv.fp4_grouped_gemv_ref(x, w, s, idx)
    ref = torch.einsum("rnk,rk->rn", _fp4_weights64(w, s)[idx], x.double())
    assert y.dtype == torch.float32 and y.shape == (R, N)
    assert _relerr(y, ref) < 1e-6


@pytest.mark.parametrize("E,N,K,R", [(8, 96, 256, 1), (16, 64, 512, 8)])
def test_nvfp4_twin_equals_float64(E, N, K, R):
    w, s, g = random_nvfp4_bank(E, N, K)
    idx = torch.randint(0, E, (R,))
    x = random_x(R, K)
    y = gemv.nvfp4_grouped_gemv_ref(x, w, s, g, idx)
    ref = torch.einsum("rnk,rk->rn", _nvfp4_weights64(w, s, g)[idx], x.double())
    assert _relerr(y, ref) < 1e-6


@pytest.mark.parametrize("M,N,K", [(1, 256, 512), (8, 200, 272), (64, 128, 384)])
def test_fp8_twin_equals_float64(M, N, K):
    w, s = random_fp8_weight(N, K)
    x = random_x(M, K)
    y = gemv.fp8_gemv_ref(x, w, s)
    ref = x.double() @ _fp8_weights64(w, s).t()
    assert y.shape == (M, N) and _relerr(y, ref) < 1e-6


# ------------------------------------------------------------------ the kernels' decode, emulated


def _emulate_e2m1_word(word: torch.Tensor) -> torch.Tensor:
    """_ptx.e2m1x8_to_f32 in torch: int32 words -> [.., 8] values * 2^-6, elements 0..7 in order."""
    w = word.long() & 0xFFFFFFFF
    lo = ((w << 2) & 0x1C1C1C1C) | ((w << 4) & 0x80808080)  # even elements as e4m3 bytes
    hi = ((w >> 2) & 0x1C1C1C1C) | (w & 0x80808080)        # odd elements
    out = []
    for b in range(4):  # byte b of lo/hi -> elements 2b, 2b+1 (cvt: low byte -> low half)
        for src in (lo, hi):
            byte = ((src >> (8 * b)) & 0xFF).to(torch.uint8)
            out.append(byte.view(Q.E4M3).float())
    return torch.stack(out, -1)


def test_decode_trick_is_exact_for_every_byte():
    """e2m1 nibble -> e4m3 byte trick: every code, both nibbles, every byte position of a word."""
    table = torch.tensor(E2M1, dtype=torch.float32)
    codes = torch.randperm(256).to(torch.uint8)  # all 256 bytes, shuffled into 64 words
    words = codes.view(torch.int32)
    got = _emulate_e2m1_word(words).flatten() * 64.0
    u = codes.long()
    want = torch.stack((table[u & 15], table[u >> 4]), -1).flatten()
    assert torch.equal(got, want)


def test_e8m0_scale_trick():
    """(b + 6) << 23 is 2^(b-127) * 2^6 for every byte the quantizer can produce (b <= 248)."""
    b = torch.arange(0, 249, dtype=torch.int32)
    got = ((b + 6) << 23).view(torch.float32).double()
    assert torch.equal(got, torch.exp2(b.double() - 127.0 + 6.0))


# ------------------------------------------------------------------ switch, imports, CPU behaviour


def test_switch(monkeypatch):
    monkeypatch.delenv("DSV4_KERNELS", raising=False)
    kernels.use(None)
    assert not kernels.enabled()
    monkeypatch.setenv("DSV4_KERNELS", "1")
    assert kernels.enabled()
    kernels.use(False)
    assert not kernels.enabled()
    kernels.use(True)
    monkeypatch.setenv("DSV4_KERNELS", "0")
    assert kernels.enabled()


def test_package_imports_without_cutlass():
    """With cutlass unimportable the package, the model and the integration points still import,
    and an enabled switch on CPU tensors quietly yields the twin (None from the dispatchers)."""
    code = (
        "import sys; sys.modules['cutlass'] = None\n"
        "import torch, dsv4, dsv4.kernels as K, dsv4.kernels.launch, dsv4.decode.static_moe, dsv4.layers.linear\n"
        "K.use(True)\n"
        "x = torch.randn(2, 256).bfloat16()\n"
        "assert K.dense_gemv(x, torch.zeros(8, 256).to(torch.float8_e4m3fn), None) is None\n"
        "assert K.expert_gemv('fp4', x, {}, torch.zeros(2, dtype=torch.long)) is None\n"
        "assert not any(m == 'cutlass' or m.startswith('cutlass.') for m in sys.modules if sys.modules[m])\n"
        "print('ok')\n"
    )
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_switch_on_does_not_change_cpu_results():
    import dsv4
    from dsv4.decode.static_moe import StaticMoE

    model = dsv4.load("tiny", dtype="bfloat16", seed=int(torch.randint(0, 1000, (1,))))
    block = model.layers[1]
    moe = StaticMoE(block.ffn)
    x = torch.randn(3, model.cfg.dim).bfloat16()
    idx = torch.randint(0, model.cfg.n_routed_experts, (3,))
    ids = torch.randint(0, model.cfg.vocab_size, (3,))
    lin = block.attn.wq_a if hasattr(block.attn, "wq_a") else None
    outs = []
    for flag in (False, True):
        kernels.use(flag)
        y = [moe.expert_linear("w1", x, idx), moe(x, ids)]
        if lin is not None:
            y.append(lin(x))
        outs.append(y)
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_triton_gemm_thresholds_follow_the_defaults_and_the_environment(monkeypatch):
    """FP8 from 3 rows and the grouped experts from 96 by default; each threshold moves with its
    variable, DSV4_TRITON_GEMM=0 turns both off, and without Triton neither runs."""
    from dsv4.kernels import ops

    monkeypatch.setattr(ops, "_TRITON", [True])
    for name in ("DSV4_TRITON_GEMM", "DSV4_TRITON_FP8_ROWS", "DSV4_TRITON_EXPERTS_ROWS"):
        monkeypatch.delenv(name, raising=False)
    assert ops.triton_gemm(3) and not ops.triton_gemm(2)
    assert ops.triton_gemm(96, "experts") and not ops.triton_gemm(95, "experts")
    assert ops.settings() == ""
    monkeypatch.setenv("DSV4_TRITON_FP8_ROWS", "1")
    monkeypatch.setenv("DSV4_TRITON_EXPERTS_ROWS", "24")
    assert ops.triton_gemm(1) and ops.triton_gemm(24, "experts") and not ops.triton_gemm(23, "experts")
    assert ops.settings() == "DSV4_TRITON_FP8_ROWS=1, DSV4_TRITON_EXPERTS_ROWS=24"
    monkeypatch.setenv("DSV4_TRITON_GEMM", "0")
    assert not ops.triton_gemm(64) and not ops.triton_gemm(384, "experts")
    monkeypatch.delenv("DSV4_TRITON_GEMM")
    monkeypatch.setattr(ops, "_TRITON", [False])
    assert not ops.triton_gemm(16)

def test_fp8_op_with_quant_rounds_the_activation_first(rng):
    """dsv4::fp8_gemv(quant=True) on an unrounded x is the op on fp8_fake_quant(x) (here through the
    twin; on CUDA with the Triton GEMM the rounding runs in the kernel, tests/test_fp8_gemm_gpu.py)."""
    from dsv4.kernels import ops
    from dsv4.ops.quantize import fp8_fake_quant, quantize_fp8_blockwise

    w, s = quantize_fp8_blockwise(torch.randn(256, 384, generator=rng))
    x = (torch.randn(2, 384, generator=rng) * 3).bfloat16()
    assert not torch.equal(fp8_fake_quant(x, 128), x)
    assert torch.equal(ops.fp8_gemv(x, w, s, 1, True), ops.fp8_gemv(fp8_fake_quant(x, 128), w, s))


def test_fp4_expert_op_with_quant_rounds_the_activation_first(rng):
    """dsv4::fp4_grouped_gemv(quant=True) on an unrounded x is the op on fp8_fake_quant(x) (the twin
    here; the Triton kernel's in-launch rounding in tests/test_triton_experts_interpret.py), and the
    dispatcher only asks for it where the rounding runs in a kernel (never on the CPU)."""
    from dsv4 import kernels
    from dsv4.kernels import ops
    from dsv4.ops.quantize import fp8_fake_quant, quantize_fp4

    banks = [quantize_fp4(torch.randn(64, 256, generator=rng)) for _ in range(3)]
    w, s = torch.stack([b[0] for b in banks]), torch.stack([b[1] for b in banks])
    x = (torch.randn(5, 256, generator=rng) * 3).bfloat16()
    idx = torch.randint(3, (5,), generator=rng)
    assert not torch.equal(fp8_fake_quant(x, 128), x)
    assert torch.equal(ops.fp4_grouped_gemv(x, w, s, idx, True), ops.fp4_grouped_gemv(fp8_fake_quant(x, 128), w, s, idx))
    before = kernels.use(True)
    try:
        assert not kernels.expert_rounds_in_kernel("fp4", x)
        assert kernels.expert_gemv("nvfp4", x, {}, idx, quant=True) is None
    finally:
        kernels.use(before)


def test_cute_gemvs_are_asked_to_round_only_whole_blocks_on_cuda(monkeypatch):
    """Where the CuTe DSL runs, the GEMVs get x unrounded (they round 128 blocks in registers: bit for
    bit in tests/test_cute_round_gpu.py); K not a multiple of 128, the CPU, or DSV4_CUTE_ROUND=0 keep
    the rounding in front (with torch ops)."""
    from types import SimpleNamespace

    from dsv4.kernels import launch, ops

    monkeypatch.setattr(launch, "_AVAILABLE", [True])
    monkeypatch.setattr(ops, "_TRITON", [False])  # no batched Triton GEMM: the CuTe GEMV at any row count
    cuda = lambda k: SimpleNamespace(is_cuda=True, shape=(1, k))  # noqa: E731
    assert ops.rounds_in_kernel(cuda(4096)) and ops.expert_rounds_in_kernel(cuda(2048))
    assert not ops.rounds_in_kernel(cuda(272)) and not ops.expert_rounds_in_kernel(cuda(96))
    assert not ops.rounds_in_kernel(SimpleNamespace(is_cuda=False, shape=(1, 4096)))
    monkeypatch.setenv("DSV4_CUTE_ROUND", "0")
    assert not ops.rounds_in_kernel(cuda(4096)) and not ops.expert_rounds_in_kernel(cuda(2048))
    assert "DSV4_CUTE_ROUND=0" in ops.settings()
    monkeypatch.setattr(launch, "_AVAILABLE", [False])
    monkeypatch.delenv("DSV4_CUTE_ROUND")
    assert not ops.rounds_in_kernel(cuda(4096))


def test_mix_sums_op_scaled_is_the_reference_mixes(rng):
    """dsv4::hc_mix_sums' dots times rsqrt(sumsq / K + eps) is mhc's rms(x) @ fn^T (the twin path
    here; the Triton kernel against float64 in tests/test_triton_interpret.py)."""
    from dsv4.kernels import ops
    from dsv4.layers.norm import rms

    x = (torch.randn(3, 4 * 64, generator=rng) * 2).bfloat16()
    fn = torch.randn(24, 4 * 64, generator=rng) * 0.1
    sums = ops.hc_mix_sums(x, fn)
    mixes = sums[:, :24] * torch.rsqrt(sums[:, 24:] / x.shape[1] + 1e-6)
    torch.testing.assert_close(mixes, rms(x, 1e-6) @ fn.t(), rtol=1e-5, atol=1e-6)


def test_sparse_attention_op_twin_is_the_reference(rng):
    """dsv4::sparse_attention off CUDA runs the reference (bf16 probabilities); the layer's dispatcher
    declines on the CPU, so the reference path stays the one the model runs there."""
    from dsv4 import kernels
    from dsv4.kernels import ops
    from dsv4.layers.rope import apply_rope
    from dsv4.ops.attention import sparse_attention_ref

    q, keys = torch.randn(2, 4, 32, generator=rng).bfloat16(), torch.randn(2, 9, 32, generator=rng).bfloat16()
    mask, sink = torch.rand(2, 9, generator=rng) < 0.6, torch.randn(4, generator=rng)
    ref = sparse_attention_ref(q[:, None], keys, mask[:, None], sink, 0.2, torch.bfloat16)[:, 0]
    assert torch.equal(ops.sparse_attention(q, keys, mask, sink, 0.2), ref)
    # the window's rows then picked compressed entries, and the inverse RoPE, as the twin composes them
    comp, sel = torch.randn(2, 7, 32, generator=rng).bfloat16(), torch.randint(0, 7, (2, 5), generator=rng)
    flat = torch.cat((keys[:, :4], comp.gather(1, sel[..., None].expand(-1, -1, 32))), 1)
    ang = torch.rand(8, generator=rng) * 9
    want = apply_rope(sparse_attention_ref(q[:, None], flat, mask[:, None], sink, 0.2, torch.bfloat16)[:, 0],
                      ang.cos(), ang.sin(), inverse=True)
    assert torch.equal(ops.sparse_attention(q, keys[:, :4], mask, sink, 0.2, ang.cos(), ang.sin(), comp, sel), want)
    before = kernels.use(True)
    try:
        assert kernels.sparse_attention(q[:, None], keys, mask[:, None], sink, 0.2, torch.bfloat16) is None
    finally:
        kernels.use(before)


def test_layer_kernels_run_at_their_measured_row_counts(monkeypatch):
    """Unset, DSV4_TRITON_<name> leaves a layer kernel to LAYER_KERNEL_ROWS (the attention kernel from
    16 rows, the mixes kernel up to 8, a kernel not listed never); 1 / 0 turns one on / off at any row count."""
    from dsv4 import kernels

    monkeypatch.setitem(kernels.LAYER_KERNEL_ROWS, "ATTN", (16, None))
    monkeypatch.setitem(kernels.LAYER_KERNEL_ROWS, "MIXES", (None, 8))
    for name in ("MIXES", "ATTN", "NEW"):
        monkeypatch.delenv(f"DSV4_TRITON_{name}", raising=False)
    assert kernels._off("ATTN", 15) and not kernels._off("ATTN", 16) and not kernels._off("ATTN", 64)
    assert not kernels._off("MIXES", 1) and not kernels._off("MIXES", 8) and kernels._off("MIXES", 9)
    assert kernels._off("NEW", 1) and kernels._off("NEW", 64)
    for name in ("MIXES", "ATTN"):
        monkeypatch.setenv(f"DSV4_TRITON_{name}", "1")
        assert not kernels._off(name, 1)
        monkeypatch.setenv(f"DSV4_TRITON_{name}", "0")
        assert kernels._off(name, 64)

