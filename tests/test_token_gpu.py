"""The compressor's whole-step kernel (dsv4/kernels/_triton_token.py) on the GPU at flash shapes."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("ratio,overlap,hd,rounding", [(4, True, 512, "kv"), (4, True, 128, "index"),
                                                      (128, False, 512, "kv")])
def test_compress_token_kernel_follows_its_twin_and_replays(ratio, overlap, hd, rounding, rng):
    """Step after step over two blocks, the gate logits raw with the ape rows added inside: one launch per step; the state buffer bit for bit the twin's
    (slot writes and the block shift are copies); the cache written only at a block's end and within
    one rounding step of the twin's; a captured step replayed at later positions equals the eager kernel
    (the block-end branch is read from the position on the device at replay)."""
    from torch.profiler import ProfilerActivity, profile

    from dsv4.cache import CompressorState
    from dsv4.kernels import _triton_token as K
    from dsv4.ops.compress import compress_token_ref
    from entry_util import close_entries

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    B, C = 2, 2 * hd if overlap else hd
    sa = CompressorState.allocate(B, ratio, hd, "cuda")
    both = sa.both.clone()
    w = (1 + 0.3 * torch.randn(hd, generator=rng)).bfloat16().cuda()
    a = torch.randn(B, 4, hd, generator=rng).bfloat16().cuda()
    b = a.clone()
    ang = (torch.rand(32, generator=rng) * 30).cuda()
    cos, sin = ang.cos(), ang.sin()
    news = [(torch.randn(B, C, generator=rng).cuda() * 2, torch.randn(B, C, generator=rng).cuda() * 3)
            for _ in range(2 * ratio)]
    ape = torch.randn(ratio, C, generator=rng).cuda()  # the gate logits come raw, the kernel adds ape[pos % m]
    for p, (kvn, zn) in enumerate(news):
        pos, before = torch.tensor(p, device="cuda"), b.clone()
        compress_token_ref(kvn, zn, sa.both, pos, a, w, cos, sin, ratio, overlap, 1e-6, rounding, ape)
        K.compress_token(kvn, zn, both, pos, b, w, cos, sin, ratio, overlap, 1e-6, rounding, ape)
        assert torch.equal(sa.both, both), p
        assert torch.equal(b, before) == ((p + 1) % ratio != 0), p
        close_entries(a, b, rounding, p)
        b.copy_(a)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        K.compress_token(kvn, zn, both, pos, b, w, cos, sin, ratio, overlap, 1e-6, rounding)
        torch.cuda.synchronize()
    assert [e.name for e in prof.events() if e.device_type.name == "CUDA"] == ["_token_kernel"]
    pos = torch.tensor(0, device="cuda")
    kvs, zs = news[0][0].clone(), news[0][1].clone()
    g_state, g_out = sa.both.clone(), a.clone()
    e_state, e_out = sa.both.clone(), a.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        K.compress_token(kvs, zs, g_state, pos, g_out, w, cos, sin, ratio, overlap, 1e-6, rounding, ape)
    for p in range(ratio - 2, ratio + 2):  # through a block's end
        pos.fill_(p)
        kvs.copy_(news[p][0])
        zs.copy_(news[p][1])
        g.replay()
        K.compress_token(kvs, zs, e_state, pos, e_out, w, cos, sin, ratio, overlap, 1e-6, rounding, ape)
        assert torch.equal(g_state, e_state) and torch.equal(g_out, e_out), p
