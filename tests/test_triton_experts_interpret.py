"""The Triton grouped expert GEMM (dsv4/kernels/_triton_experts.py) on the CPU through Triton's
interpreter, against the float64 twin; and an ahead-of-time sm_90 build that must use tensor cores.

Each case runs in a child process (TRITON_INTERPRET is read when a kernel is defined) whose bf16
tl.dot is replaced by the tensor-core model of tests/test_triton_interpret.py (exact products, an fp32
accumulator truncated after each 16-wide K chunk). Banks come from quantize.py (per-row magnitudes
2^-12..1, so NVFP4 gets subnormal e4m3 scales); routings give some experts no rows, one expert more
than BLOCK_M rows, and duplicates. The GPU runs are in tests/test_experts_gemm_gpu.py.
"""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

from ptx_model import run_ptx as _run_ptx
from test_triton_interpret import _interpret as _run  # the child-process runner and its tensor-core model


pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton not installed (its interpreter runs the kernels)")

_HELPERS = '''
from dsv4.kernels import _triton_experts as T
from dsv4.ops import quantize as Q

def bank(fmt, E, N, K):
    ws, ss, gs = [], [], []
    for e in range(E):
        w = torch.randn(N, K, generator=g) * torch.exp2(torch.randint(-12, 1, (N, 1), generator=g).float())
        w = w * 2.0 ** (e % 5 - 2)  # experts of different magnitudes (different NVFP4 global scales)
        q = Q.quantize_fp4(w) if fmt == "fp4" else Q.quantize_nvfp4(w)
        ws.append(q[0]); ss.append(q[1]); gs.append(q[2] if fmt == "nvfp4" else torch.ones(()))
    return torch.stack(ws), torch.stack(ss), torch.stack(gs) if fmt == "nvfp4" else None

def route(R, E):
    """Half the rows to one hot expert, the rest over a random half of the others: empty experts,
    one with > BLOCK_M rows once R >= 48, duplicates."""
    hot = int(torch.randint(E, (), generator=g))
    some = torch.randperm(E, generator=g)[:max(1, E // 2)]
    idx = some[torch.randint(len(some), (R,), generator=g)]
    idx[torch.rand(R, generator=g) < 0.5] = hot
    if R >= 48:
        idx[:T.BLOCK_M + 1] = hot  # the hot expert always takes more than one BLOCK_M chunk of rows
    return idx.long()

def ref64(fmt, x, w, s, gl, idx):
    vals = Q._e2m1_values(Q.unpack_fp4(w)).double()
    sc = Q.e8m0_to_float(s).double() if fmt == "fp4" else s.float().double() * gl.double()[:, None, None]
    W = (vals.unflatten(-1, (sc.shape[-1], -1)) * sc[..., None]).flatten(-2)  # [E, N, K]
    return torch.einsum("rk,rnk->rn", x.double(), W[idx])

def check(fmt, E, N, K, R, uint8_bytes=False):
    w, s, gl = bank(fmt, E, N, K)
    x = (torch.randn(R, K, generator=g) * torch.exp2(torch.randint(-20, 21, (R, 1), generator=g).float())).bfloat16()
    idx = route(R, E)
    counts = torch.bincount(idx, minlength=E)
    assert (counts == 0).any() or R >= 3 * E, counts
    if R >= 48:
        assert counts.max() > T.BLOCK_M, counts
    ref = ref64(fmt, x, w, s, gl, idx)
    if uint8_bytes:  # the bank as raw bytes: uint8 weight, uint8 UE8M0 scale
        w, s = w.view(torch.uint8), s.view(torch.uint8)
    y = T.grouped_expert_gemm(fmt, x, w, s, idx, global_scale=gl)
    assert y.dtype == torch.float32 and y.shape == (R, N)
    err = ((y.double() - ref).abs().amax(1) / ref.abs().amax(1)).max().item()
    assert err < 2e-6, (fmt, E, N, K, R, err)
    if (fmt, R >= 48) not in _REPEATED:  # a second run, into `out`: the same bits (deterministic), once a kind
        _REPEATED.add((fmt, R >= 48))
        out = torch.full((R, N), float("nan"))
        assert T.grouped_expert_gemm(fmt, x, w, s, idx, global_scale=gl, out=out) is out and torch.equal(out, y)
    return err

_REPEATED = set()
'''

# (E, N, K, R): every listed E, N, K and R appears; R = 96 with E = 4 gives 4 slots, R = 3 with E = 32 gives 3
CASES = ((4, 64, 256, 3), (32, 256, 512, 6), (4, 256, 256, 16), (32, 64, 512, 48), (4, 64, 512, 96),
         (32, 64, 256, 96))


def _interpret(body: str) -> None:
    _run(_HELPERS + textwrap.dedent(body))


@pytest.mark.parametrize("fmt", ["fp4", "nvfp4"])
def test_grouped_experts_match_float64(fmt):
    _interpret(f"""
        fmt = {fmt!r}
        for i, (E, N, K, R) in enumerate({CASES!r}):
            check(fmt, E, N, K, R, uint8_bytes=(fmt == "fp4" and i % 2 == 1))
        T.TARGET_PROGRAMS = 1  # BLOCK_N 64 (the wide tile)
        assert T.tiles(48, 32, 256, 512)[0] == 64
        check(fmt, 32, 256, 512, 48)
        assert bf16_dots[0] > 0  # the tensor-core model ran
    """)


def test_grouped_experts_round_the_activation_in_the_kernel():
    """quant=True takes x unrounded (each row and 128-block at its own power-of-two magnitude, a zero
    block) and rounds it in the grouping launch as fp8_fake_quant(x, 128) does: through identity experts
    (one product per output) the output is the rounded x bit for bit; through random FP4 and NVFP4
    banks it matches float64 on the rounded x."""
    _interpret("""
        from dsv4.ops.quantize import fp8_fake_quant
        for E, N, K, R in ((4, 64, 256, 3), (32, 128, 512, 48), (4, 64, 384, 96)):
            mag = torch.exp2(torch.randint(-30, 31, (R, K // 128), generator=g).float()).repeat_interleave(128, 1)
            x = (torch.randn(R, K, generator=g) * mag).bfloat16()
            x[0, :128] = 0
            rounded = fp8_fake_quant(x, 128)
            assert not torch.equal(rounded, x)  # the comparison below can fail
            idx = route(R, E)
            eye = Q.quantize_fp4(torch.eye(K))
            ew, es = eye[0].expand(E, K, K // 2).contiguous(), eye[1].expand(E, K, K // 32).contiguous()
            assert torch.equal(T.grouped_expert_gemm("fp4", x, ew, es, idx, quant=True), rounded.float())
            for fmt in ("fp4", "nvfp4"):
                w, s, gl = bank(fmt, E, N, K)
                y = T.grouped_expert_gemm(fmt, x, w, s, idx, global_scale=gl, quant=True)
                ref = ref64(fmt, rounded, w, s, gl, idx)
                err = ((y.double() - ref).abs().amax(1) / ref.abs().amax(1).clamp(min=1e-300)).max().item()
                assert err < 2e-6, (fmt, E, N, K, R, err)
                assert torch.equal(y, T.grouped_expert_gemm(fmt, x, w, s, idx, global_scale=gl, quant=True))
        try:
            T.grouped_expert_gemm("fp4", x[:, :96], w[..., :48], s[..., :3], idx, quant=True)
            raise AssertionError("K = 96 accepted for the in-kernel rounding")
        except ValueError:
            pass
    """)


def test_grouping_of_extreme_routings():
    """All rows to one expert (one slot of 96 rows: six row chunks), to the last expert, one row per
    expert (every slot filled), R > E with every expert used."""
    _interpret("""
        E, N, K = 32, 64, 256
        w, s, _ = bank("fp4", E, N, K)
        for idx in (torch.zeros(96, dtype=torch.long), torch.full((5,), E - 1, dtype=torch.long),
                    torch.randperm(E, generator=g), torch.arange(96) % E, torch.arange(48).flip(0) % E):
            R = len(idx)
            x = torch.randn(R, K, generator=g).bfloat16()
            ref = ref64("fp4", x, w, s, None, idx)
            y = T.grouped_expert_gemm("fp4", x, w, s, idx)
            err = ((y.double() - ref).abs().amax(1) / ref.abs().amax(1)).max().item()
            assert err < 2e-6, (idx.tolist(), err)
    """)


def test_sm90_build_uses_tensor_cores():
    """Ahead-of-time build for sm_90 (no GPU needed): the PTX has mma and streams the weights with
    cp.async (the pipeline), for both formats and both tile widths; the grouping kernel (with the
    quant path's rounding programs) builds too."""
    pytest.importorskip("triton.backends.nvidia")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dsv4.kernels import _triton_experts as T

    names = ["x_ptr", "w_ptr", "s_ptr", "g_ptr", "y_ptr", "rows_ptr", "slot_expert_ptr", "slot_start_ptr",
             "slot_count_ptr", "N", "K", "sxm", "swe", "swn", "sse", "ssn", "sym"]
    types = ["*bf16", "*u8", "*u8", "*fp32", "*fp32", "*i32", "*i32", "*i32", "*i32"] + ["i32"] * 8
    sig = dict(zip(names, types)) | dict.fromkeys(("NV", "BLOCK_M", "BLOCK_N", "BLOCK_K", "ASM", "PDL"), "constexpr")
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(names))}  # what the JIT sees at Flash shapes
    for nv in (False, True):
        for bn in (32, 64):
            src = ASTSource(fn=T._experts_kernel, signature=sig, attrs=attrs,
                            constexprs={"NV": nv, "BLOCK_M": T.BLOCK_M, "BLOCK_N": bn, "BLOCK_K": 128, "ASM": True,
                                        "PDL": bn == 64})
            ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                 options={"num_warps": 4, "num_stages": 4}).asm["ptx"]
            assert "mma.sync" in ptx and "cp.async" in ptx, (nv, bn)
            assert "mul.rn.bf16x2" in ptx and "prmt.b32" in ptx, (nv, bn)  # the inline decode
            assert ("griddepcontrol.wait" in ptx) == (bn == 64), (nv, bn)  # PDL only where asked for
    gsig = {"idx_ptr": "*i64", "rows_ptr": "*i32", "slot_expert_ptr": "*i32", "slot_start_ptr": "*i32",
            "slot_count_ptr": "*i32", "R": "i32", "P": "i32", "x_ptr": "*bf16", "xr_ptr": "*bf16",
            "K": "i32", "sxm": "i32", "BLOCK_R": "constexpr", "BLOCK_E": "constexpr", "QB": "constexpr",
            "PDL": "constexpr"}
    triton.compile(ASTSource(fn=T._group_kernel, signature=gsig,
                             constexprs={"BLOCK_R": T.BLOCK_R, "BLOCK_E": 256, "QB": T.QUANT_BLOCKS, "PDL": True}),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def test_inline_ptx_nibble_decode_is_exact_for_every_byte():
    """The GPU decode (_LO_ASM / _HI_ASM), run instruction by instruction on the CPU: for every byte
    value in each of the four positions of a word and random factors (e4m3-like, as the kernel's), each output half is
    the byte's low (even element) / high (odd element) e2m1 nibble times 2^-126 times its factor, in
    element order (byte i -> element i; element 0 in the low half of $0)."""
    pytest.importorskip("triton")
    import numpy as np
    import torch

    from dsv4.kernels import _triton_experts as T
    from dsv4.ops import quantize as Q

    e2m1 = Q._e2m1_values(torch.arange(16, dtype=torch.uint8)).double().numpy()
    rng = np.random.default_rng(int(torch.randint(2**31, ())))
    for asm, shift in ((T._LO_ASM.value, 0), (T._HI_ASM.value, 4)):
        for b in range(256):
            pos = int(rng.integers(4))
            word = int(rng.integers(0, 2**32)) & ~(0xFF << (8 * pos)) | (b << (8 * pos))
            exps = rng.integers(128, 255, size=4)  # the kernel's factors: 2^(e-127) * (1 + m/8), e >= 128
            mants = rng.integers(0, 8, size=4)
            f = [(int(e) << 7) | (int(m) << 4) for e, m in zip(exps, mants)]
            regs = _run_ptx(asm, {"$2": word, "$3": f[0] | f[1] << 16, "$4": f[2] | f[3] << 16})
            for i in range(4):
                half = (regs["$0"] if i < 2 else regs["$1"]) >> (16 * (i % 2)) & 0xFFFF
                got = float(np.array([half << 16], dtype=np.uint32).view(np.float32)[0])
                code = (word >> (8 * i + shift)) & 0xF
                want = e2m1[code] * 2.0 ** -126 * 2.0 ** (int(exps[i]) - 127) * (1 + int(mants[i]) / 8)
                assert got == want, (asm[:20], hex(word), i, code, got, want)
