"""On a GPU: the Triton bf16 GEMV and Sinkhorn, fused graphs with the kernels on, the bench's GPU rows."""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4.decode.graph import CUDAGraphDecoder
from dsv4.decode.verify import verify_replay

pytestmark = pytest.mark.gpu



@pytest.mark.parametrize("M,N,K", [(1, 129280, 4096), (1, 512, 4096), (3, 1024, 4096), (16, 256, 4096),
                                   (5, 300, 200)])
def test_bf16_gemv_matches_float64_and_is_deterministic(M, N, K, rng):
    from dsv4.kernels import ops

    x = torch.randn(M, K, generator=rng).cuda()
    w = torch.randn(N, K, generator=rng).bfloat16().cuda()
    y = ops.bf16_gemv(x, w)
    ref = x.double() @ w.double().t()
    scale = (x.double().abs() @ w.double().abs().t()).max()
    assert ((y.double() - ref).abs().max() / scale).item() < 1e-6
    assert torch.equal(y, ops.bf16_gemv(x, w))


@pytest.mark.parametrize("T,hc", [(1, 4), (16, 4), (70, 4), (5, 3)])
def test_sinkhorn_kernel_is_one_launch_matching_float64(T, hc, rng):
    from torch.profiler import ProfilerActivity, profile

    from dsv4.kernels import ops
    from dsv4.ops.sinkhorn import sinkhorn_ref

    x = (torch.randn(T, hc, hc, generator=rng) * 3).cuda()
    ops.sinkhorn(x, 20, 1e-6)  # compiles
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        y = ops.sinkhorn(x, 20, 1e-6)
        torch.cuda.synchronize()
    kernels_run = [e for e in prof.events() if e.device_type.name == "CUDA" and "sinkhorn" in e.name]
    assert len(kernels_run) == 1, [e.name for e in prof.events()]
    ref = sinkhorn_ref(x.double(), 20, 1e-6)
    assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < 1e-6
    assert torch.equal(y, ops.sinkhorn(x, 20, 1e-6))


@pytest.mark.parametrize("T,dtype", [(1, torch.bfloat16), (16, torch.bfloat16), (3, torch.float32)])
def test_mix_sums_is_one_launch_matching_float64_and_replays_bitwise(T, dtype, rng):
    """The mHC mixes kernel at the flash site shape (hc*d = 16384, 24 mixes): one launch (split-K
    finished in the kernel), float64 agreement, and a graph replay equal to the eager call."""
    from torch.profiler import ProfilerActivity, profile

    from dsv4.kernels import ops

    x = (torch.randn(T, 16384, generator=rng) * 2).to(dtype).cuda()
    fn = (torch.randn(24, 16384, generator=rng) * 0.01).cuda()
    y = ops.hc_mix_sums(x, fn)  # compiles
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        y = ops.hc_mix_sums(x, fn)
        torch.cuda.synchronize()
    launched = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert launched == ["_mix_sums_kernel"], launched
    ref = torch.cat((x.double() @ fn.double().t(), x.double().square().sum(-1, keepdim=True)), -1)
    scale = x.double().abs().amax(1, keepdim=True) * fn.double().abs().amax() * 128
    assert ((y.double() - ref)[:, :24].abs() / scale).max().item() < 1e-6
    assert ((y[:, 24].double() - ref[:, 24]).abs() / ref[:, 24]).max().item() < 1e-6
    out = torch.empty_like(y)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(ops.hc_mix_sums(x, fn))
    for _ in range(3):
        x.copy_((torch.randn(T, 16384, generator=rng) * 2).to(dtype))
        graph.replay()
        assert torch.equal(out, ops.hc_mix_sums(x, fn))


@pytest.mark.parametrize("B,H,N,D", [(1, 64, 640, 512), (16, 64, 640, 512), (2, 20, 70, 128)])
def test_sparse_attention_kernel_follows_the_reference_in_three_launches(B, H, N, D, rng):
    """The decode attention kernels at flash shapes (64 heads, 128 window + 512 selected keys of 512):
    three launches (split stats, split outputs, their sum), each timed, within a bf16 step of the reference (which rounds its probabilities to bf16 too),
    masked keys without influence, and a graph replay equal to the eager call."""
    from torch.profiler import ProfilerActivity, profile

    from dsv4.kernels import ops
    from dsv4.ops.attention import sparse_attention_ref

    q = torch.randn(B, H, D, generator=rng).bfloat16().cuda()
    keys = torch.randn(B, N, D, generator=rng).bfloat16().cuda()
    mask = (torch.rand(B, N, generator=rng) < 0.8).cuda()
    sink = torch.randn(H, generator=rng).cuda()
    o = ops.sparse_attention(q, keys, mask, sink, D ** -0.5)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        o = ops.sparse_attention(q, keys, mask, sink, D ** -0.5)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    assert [e.name for e in events] == ["_split_stats", "_split_out", "_split_sum"], [e.name for e in events]
    print(f"attention B={B} H={H} N={N} D={D}: " + ", ".join(f"{e.name} {e.time_range.elapsed_us():.1f} us"
                                                               for e in events))
    ref = sparse_attention_ref(q[:, None], keys, mask[:, None], sink, D ** -0.5, torch.bfloat16)[:, 0]
    err = ((o.float() - ref.float()).abs().amax(-1) / ref.float().abs().amax(-1)).max().item()
    assert err < 2e-2, err
    other = keys.clone()
    other[~mask] = 77.0
    assert torch.equal(o, ops.sparse_attention(q, other, mask, sink, D ** -0.5))
    from dsv4.layers.rope import apply_rope  # the inverse RoPE in the last launch (DSV4_TRITON_ATTN_ROPE=1)

    ang = (torch.rand(32, generator=rng) * 40).cuda()
    roped = ops.sparse_attention(q, keys, mask, sink, D ** -0.5, ang.cos(), ang.sin())
    want = apply_rope(o, ang.cos(), ang.sin(), inverse=True)
    assert ((roped.float() - want.float()).abs() <= want.float().abs() * 2 ** -7).all()  # one bf16 step (FMA)
    assert torch.equal(roped[..., :D - 64], o[..., :D - 64])
    # the keys read where they lie (DSV4_TRITON_ATTN_KEYS=1): the window, then picked compressed entries
    W = min(128, N // 2)
    comp = torch.randn(B, 2 * N, D, generator=rng).bfloat16().cuda()
    sel = torch.randint(0, 2 * N, (B, N - W), generator=rng).cuda()
    flat = torch.cat((keys[:, :W], comp.gather(1, sel[..., None].expand(-1, -1, D))), 1)
    assert torch.equal(ops.sparse_attention(q, keys[:, :W], mask, sink, D ** -0.5, comp=comp, sel=sel),
                       ops.sparse_attention(q, flat, mask, sink, D ** -0.5))
    out = torch.empty_like(o)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(ops.sparse_attention(q, keys, mask, sink, D ** -0.5))
    for _ in range(2):
        keys.copy_(torch.randn(B, N, D, generator=rng).bfloat16())
        graph.replay()
        assert torch.equal(out, ops.sparse_attention(q, keys, mask, sink, D ** -0.5))


@pytest.mark.parametrize("mode", ["ab", "full"])
def test_fused_graph_is_bitwise_to_fused_eager_with_kernels(mode, kernels_on, rng):
    model = dsv4.load("tiny", device="cuda", dtype="bfloat16", seed=int(torch.randint(0, 999, (1,), generator=rng)))
    dec = CUDAGraphDecoder(model, mode=mode, batch_size=2, fuse=True)
    res = verify_replay(dec, steps=32, seed=int(torch.randint(0, 2**31, (1,), generator=rng)))
    assert res.ok, res.first_mismatch


@pytest.mark.parametrize("mode", ["ab", "full"])
def test_fused_graph_follows_the_reference_path_float32(mode, kernels_on, rng):
    model = dsv4.load("tiny", device="cuda", dtype="float32")
    ids = torch.randint(0, 1024, (1, 200), generator=rng).cuda()  # 196 decode steps
    model.prefill(ids[:, :4])
    ref = [model.decode(ids[:, i]) for i in range(4, 200)]  # before the decoder stacks any weights
    dec = CUDAGraphDecoder(model, mode=mode, fuse=True)
    dec.prefill(ids[:, :4])
    for k, i in enumerate(range(4, 200)):
        out = dec.decode(ids[:, i].cpu())
        assert ((out - ref[k]).norm() / ref[k].norm()).item() <= 1e-5, f"step {k}"


def test_bench_gpu_rows_on_tiny(tmp_path):
    from audit.bench.run import bench
    from audit.bench.report import write_reports

    # float32: the drift against the unfused path is summation order only (in bfloat16 one flipped
    # rounding can move a top-k choice, and a tiny random model's logits with it)
    res = bench("tiny", steps=8, batches=(2,), contexts=(300,), device="cuda", dtype="float32", verify_steps=4)
    rows = {(r.mode, r.batch, r.context): r for r in res.rows}
    assert len(rows) == 4
    for (mode, _, _), r in rows.items():
        assert r.ms_median and r.ms_median > 0, (mode, r.note)
        if mode in ("ab", "full"):
            assert r.bitwise_ok and r.fused and r.drift is not None and r.drift < 1e-4, (mode, r.note, r.drift)
    assert res.kernels and res.copy_tb_s > 0.5
    full = rows[("full", 2, 300)]
    assert full.kernels and full.kernels[0]["per_step"] > 10  # the replay's kernels were profiled
    files = write_reports(res, tmp_path)
    assert (tmp_path / "bench-tiny.png").stat().st_size > 0 and len(files) == 3


@pytest.mark.parametrize("hd,kv", [(512, "kv"), (128, "none"), (128, "index")])
def test_compress_entry_kernel_follows_its_twin_in_one_launch(hd, kv, rng):
    """DSV4_TRITON_ENTRY's kernel at flash shapes (the KV compressors, the indexer's): one launch; the cache
    row equals the twin's up to a rare one-step move of the rounding (the norm's fp32 sum order), written
    only when the block completes; graph replay."""
    from torch.profiler import ProfilerActivity, profile

    from dsv4.kernels import _triton_entry as K
    from dsv4.ops.compress import compress_entry_ref
    from entry_util import close_entries

    w = (1 + 0.3 * torch.randn(hd, generator=rng)).bfloat16().cuda()
    out = torch.randn(2, 8, hd, generator=rng).bfloat16().cuda()
    pooled = (torch.randn(2, hd, generator=rng) * 4).cuda()
    ang = (torch.rand(32, generator=rng) * 30).cuda()
    cos, sin = ang.cos(), ang.sin()
    for p in (3, 6, 7):
        a, b, pos = out.clone(), out.clone(), torch.tensor(p, device="cuda")
        compress_entry_ref(pooled, w, cos, sin, pos, a, 4, 1e-6, kv)
        K.compress_entry(pooled, w, cos, sin, pos, b, 4, 1e-6, kv)
        close_entries(a, b, kv, p)
        assert torch.equal(b, out) == ((p + 1) % 4 != 0)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        K.compress_entry(pooled, w, cos, sin, pos, b, 4, 1e-6, kv)
        torch.cuda.synchronize()
    assert [e.name for e in prof.events() if e.device_type.name == "CUDA"] == ["_entry_kernel"]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        K.compress_entry(pooled, w, cos, sin, pos, b, 4, 1e-6, kv)
    pooled.copy_(torch.randn(2, hd, generator=rng).cuda())
    g.replay()
    want = out.clone()
    K.compress_entry(pooled, w, cos, sin, pos, want, 4, 1e-6, kv)
    assert torch.equal(b[:, 1], want[:, 1])
