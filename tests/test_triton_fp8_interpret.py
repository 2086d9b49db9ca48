"""The Triton FP8 weight GEMM (dsv4/kernels/_triton_fp8.py) on the CPU through Triton's interpreter,
against the twin fp8_gemv_ref's definition computed in float64.

Same pattern as tests/test_triton_interpret.py: each case runs in a child process (TRITON_INTERPRET is
read when a kernel is defined), skipped where Triton is not installed, and the child swaps the
interpreter's bf16 `tl.dot` (which multiplies bit patterns: triton-lang/triton#11584) for that file's
model of a tensor core (exact products, an fp32 accumulator truncated per 16-wide K chunk). The GPU
runs are in tests/test_fp8_gemm_gpu.py.
"""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

from test_triton_interpret import _interpret  # the child-process runner and its tensor-core model

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton not installed (its interpreter runs the kernels)")

_SETUP = textwrap.dedent("""
    from dsv4.kernels import _triton_fp8 as F
    from dsv4.ops import quantize as Q
    from dsv4.ops.gemv import fp8_gemv_ref

    def make(M, N, K, G):
        # weights: random fp32 with a different power-of-two magnitude per 128 x 128 block, so each
        # block has its own scale; rows of x on the e4m3 grid, scaled by 2^-20..2^20 row by row
        bo, bi = -(-N // 128), -(-K // 128)
        mag = torch.exp2(torch.randint(-8, 9, (bo, bi), generator=g).float())
        mag = mag.repeat_interleave(128, 0)[:N].repeat_interleave(128, 1)[:, :K]
        w, s = Q.quantize_fp8_blockwise(torch.randn(N, K, generator=g) * mag)
        x = Q.fp8_fake_quant(torch.randn(M * G, -(-K // 128) * 128, generator=g))[:, :K]
        x = (x * torch.exp2(torch.randint(-20, 21, (M * G, 1), generator=g).float())).bfloat16()
        return x, w, s

    def ref64(x, w, s, G):
        wd = Q.dequantize_fp8_blockwise(w, s, dtype=torch.float64)
        xg = x.double().unflatten(0, (-1, G))  # [M, G, K]: row m*G + g feeds group g
        return torch.einsum("mgk,gnk->mgn", xg, wd.unflatten(0, (G, -1))).flatten(1)

    def check(M, N, K, G, scale_bytes=False):
        x, w, s = make(M, N, K, G)
        if scale_bytes:
            s = s.view(torch.uint8)
        y = F.fp8_gemm(x, w, s, groups=G)
        ref = ref64(x, w, s if not scale_bytes else s.view(torch.float8_e8m0fnu), G)
        assert y.shape == (M, N) and y.dtype == torch.float32
        err = ((y.double() - ref).abs().amax(1) / ref.abs().amax(1)).max().item()
        assert err < 2e-6, (M, N, K, G, err, F.tiles(M, N, K, G))
        twin = fp8_gemv_ref(x, w, s, G).double()  # the twin agrees with float64 too (sanity of ref64)
        assert ((twin - ref).abs().amax(1) / ref.abs().amax(1)).max().item() < 1e-5
        split = F.tiles(M, N, K, G)[3] > 1
        if (split, G) not in REPEATED:  # a second run, into `out`: the same bits (deterministic), once a kind
            REPEATED.add((split, G))
            out = torch.full((M, N), float("nan"))
            assert F.fp8_gemm(x, w, s, groups=G, out=out) is out and torch.equal(out, y)
        return split

    REPEATED = set()
""")  # at column 0, so the bodies below are dedented on their own


def test_fp8_gemm_matches_float64():
    """Every M, N, K of the brief, each with each other value at least once; N = 300 / K = 320 are not
    multiples of 128 (the twin pads the scale grid); M = 80 takes two row tiles."""
    _interpret(_SETUP + textwrap.dedent("""
        seen = set()
        for M, N, K in ((3, 256, 256), (5, 384, 512), (16, 2048, 256), (17, 384, 1536), (64, 256, 512),
                        (3, 2048, 1536), (16, 256, 1536), (64, 2048, 256), (17, 256, 512), (5, 300, 320),
                        (80, 384, 256)):
            seen.add(check(M, N, K, 1))
        assert seen == {True, False}  # both the split-K and the single-pass paths ran
        from dsv4.kernels import _triton_splitk as S  # split tiles were finished in the kernel, counters reset
        assert S._COUNTERS and all(int(c.abs().sum()) == 0 for c in S._COUNTERS.values())
        assert check(16, 384, 512, 1, scale_bytes=True) is not None  # uint8 scale bytes work alike
        assert bf16_dots[0] > 0  # the tensor-core model ran
    """))


def test_fp8_gemm_groups_match_float64():
    """wo_a's grouped form: x [M*G, K], output columns of group g read x row m*G + g. N = 384 with
    G = 8 gives N/G = 48: 16-wide tiles."""
    _interpret(_SETUP + textwrap.dedent("""
        for M, N, K, G in ((3, 256, 256, 2), (5, 2048, 512, 8), (16, 384, 1536, 2), (17, 256, 512, 8),
                           (64, 2048, 256, 2), (16, 384, 256, 8), (3, 2048, 1536, 8)):
            check(M, N, K, G)
        x, w, s = make(4, 384, 256, 3)  # N/G = 128 but 3 does not divide the rows given for M = 4
        try:
            F.fp8_gemm(x[:-1], w, s, groups=3)
            raise AssertionError("mismatched x rows accepted")
        except ValueError:
            pass
    """))


def test_fp8_gemm_one_pass_over_long_k():
    """No split over K = 4096 (a Flash K): per-block fresh partials keep the error at fp32 rounding
    even under the truncating tensor-core model."""
    _interpret(_SETUP + textwrap.dedent("""
        F.TARGET_PROGRAMS = 1
        assert F.tiles(16, 128, 4096)[3] == 1
        check(16, 128, 4096, 1)
        check(3, 256, 4096, 2)
    """))


def test_fp8_gemm_rounds_the_activation_in_the_kernel_as_fp8_fake_quant_does():
    """quant=True takes x unrounded (here with a different power-of-two magnitude per 128 block and
    row, so each block has its own activation scale, and some exact zeros and ties) and rounds it in
    the prologue as `fp8_fake_quant(x, 128)` does: through identity weights (one product per output,
    exact in any accumulation) the output is the rounded x bit for bit; through random weights it
    matches the float64 product of the rounded x, with the e4m3 x e4m3 tensor-core dots (modelled
    here: exact products, fp32 accumulator truncated per 32-wide K chunk). M = 1 and 2 (batch-1
    decode) included; K % 128 != 0 is refused."""
    _interpret(_SETUP + textwrap.dedent("""
        def unrounded(rows, K):
            mag = torch.exp2(torch.randint(-30, 31, (rows, K // 128), generator=g).float())
            x = (torch.randn(rows, K, generator=g) * mag.repeat_interleave(128, 1))
            x[0, :64] = 0.0  # a half-zero block, and a whole zero block where K allows
            if K >= 512:
                x[-1, 256:384] = 0.0
            return x.bfloat16()

        for M, K in ((1, 512), (3, 256), (17, 384)):
            x = unrounded(M, K)
            eye, es = Q.quantize_fp8_blockwise(torch.eye(K))
            rounded = Q.fp8_fake_quant(x, 128)
            assert not torch.equal(rounded, x)  # the rounding changes x: the comparison can fail
            assert torch.equal(F.fp8_gemm(x, eye, es, quant=True), rounded.float()), (M, K)
        for M, N, K, G in ((1, 256, 512, 1), (2, 384, 256, 1), (5, 256, 1536, 1), (1, 2048, 256, 8),
                           (17, 256, 512, 2)):
            _, w, s = make(M, N, K, G)
            x = unrounded(M * G, K)
            fused = F.fp8_gemm(x, w, s, groups=G, quant=True)
            ref = ref64(Q.fp8_fake_quant(x, 128), w, s, G)
            err = ((fused.double() - ref).abs().amax(1) / ref.abs().amax(1).clamp(min=1e-300)).max().item()
            assert err < 2e-6, (M, N, K, G, err)
            assert torch.equal(fused, F.fp8_gemm(x, w, s, groups=G, quant=True))  # deterministic
        assert fp8_dots[0] > 0  # the e4m3 dot model ran
        _, w, s = make(1, 256, 320, 1)
        try:
            F.fp8_gemm(torch.randn(1, 320).bfloat16(), w, s, quant=True)
            raise AssertionError("K = 320 accepted for the in-kernel rounding")
        except ValueError:
            pass
    """))
