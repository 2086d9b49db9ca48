"""Microbenchmark of the decode GEMV kernels: achieved weight bandwidth vs the copy bandwidth of
the same run, next to torch baselines. Run `python -m dsv4.kernels.bench [--quick | --shapes]` on a GPU
(not a test): --quick the headline cases and one Flash layer's batch-1 launches as the model makes them,
--shapes those launches over launch shapes (launch.TUNE), each next to a device copy of the same bytes.

Method: weights are random (never zeros); each timed unit is a CUDA
graph of S calls that rotate over different experts / weight copies (so L2, 60 MB on an H200,
does not serve the weights), replayed several times; the median replay over S is one call's
time, launch overhead amortized as in a captured decode step. Bandwidth counts the weight and
scale bytes of the DISTINCT experts a call reads (the least any implementation must read).
Baselines that cannot be captured are timed eagerly; ones that do not run are reported as
'unsupported' with the error. Prints a rich table last; writes JSON to $OUT if set.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import torch

from dsv4 import kernels
from dsv4.kernels import launch
from dsv4.ops import gemv
from dsv4.ops import quantize as Q

MODELS = {"flash": (4096, 2048, 256), "pro": (7168, 3072, 384)}  # d, inter, routed experts
TOPK = 6
S = 24      # calls per timed graph
REPS = 7


def _rand_x(R, K):
    x = torch.randn(R, K, device="cuda")
    return Q.fp8_fake_quant(x.to(torch.bfloat16), 128)


def time_calls(fns, graph: bool = True) -> float:
    """Seconds per call: median over REPS of (one replay of a graph holding all fns) / len(fns)."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    run = None
    if graph:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for f in fns:
                    f()
            run = g.replay
        except Exception:  # noqa: BLE001 - not capturable: time eagerly
            torch.cuda.synchronize()
            run = None
    if run is None:
        def run():
            for f in fns:
                f()
    run()
    return statistics.median(event_times(run, REPS)) / 1e3 / len(fns)


def event_times(run, reps: int) -> list[float]:
    """Milliseconds of each of `reps` calls of run(), by CUDA events, each synchronized before the next."""
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return times


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (the ceiling)."""
    n = 1 << 30
    src = torch.randint(-128, 128, (n,), dtype=torch.int8, device="cuda")
    dst = torch.empty_like(src)
    t = time_calls([lambda: dst.copy_(src)] * 4, graph=False)
    return 2 * n / t


def _routing(E, batch, calls):
    """Per call: top-6 distinct experts per token (like the router), rows = batch x 6."""
    idx = [torch.stack([torch.randperm(E)[:TOPK] for _ in range(batch)]).flatten().cuda() for _ in range(calls)]
    uniq = statistics.mean(len(set(i.tolist())) for i in idx)
    return idx, uniq


def _row(results, copy_bw, op, impl, secs, nbytes, note=""):
    r = {"op": op, "impl": impl, "us": None if secs is None else secs * 1e6,
         "TBps": None if secs is None else nbytes / secs / 1e12,
         "pct_copy": None if secs is None else 100 * nbytes / secs / copy_bw, "note": note}
    results.append(r)
    print(json.dumps(r), flush=True)


def _try(results, copy_bw, op, impl, nbytes, make_fns, graph=True):
    try:
        fns = make_fns()
        _row(results, copy_bw, op, impl, time_calls(fns, graph), nbytes)
    except Exception as e:  # noqa: BLE001 - a baseline that does not run is a result
        _row(results, copy_bw, op, impl, None, nbytes, f"unsupported: {type(e).__name__}: {str(e)[:160]}")


def bench_grouped(results, copy_bw, model, proj, batch, fmt="fp4"):
    d, inter, E = MODELS[model]
    N, K = (inter, d) if proj == "w1" else (d, inter)
    R = batch * TOPK
    if fmt == "fp4":
        w = torch.randint(-128, 128, (E, N, K // 2), dtype=torch.int8, device="cuda")
        s = torch.randint(112, 132, (E, N, K // 32), dtype=torch.uint8, device="cuda").view(Q.E8M0)
        per_expert = N * K // 2 + N * K // 32
    else:
        w = torch.randint(-128, 128, (E, N, K // 2), dtype=torch.int8, device="cuda")
        s = (torch.rand(E, N, K // 16, device="cuda") * 400 + 0.01).to(Q.E4M3)
        g = torch.rand(E, device="cuda") * 1e-3 + 1e-4
        per_expert = N * K // 2 + N * K // 16
    idx, uniq = _routing(E, batch, S)
    xs = [_rand_x(R, K) for _ in range(S)]
    outs = [torch.empty(R, N, device="cuda") for _ in range(S)]
    op = f"{fmt} grouped {model} {proj} N={N} K={K} batch={batch} rows={R}"
    nbytes = uniq * per_expert
    if fmt == "fp4":
        kern = [lambda i=i: kernels.fp4_grouped_gemv(xs[i], w, s, idx[i], outs[i]) for i in range(S)]
        twin = [lambda i=i: gemv.fp4_grouped_gemv_ref(xs[i], w, s, idx[i]) for i in range(4)]
    else:
        kern = [lambda i=i: kernels.nvfp4_grouped_gemv(xs[i], w, s, g, idx[i], outs[i]) for i in range(S)]
        twin = [lambda i=i: gemv.nvfp4_grouped_gemv_ref(xs[i], w, s, g, idx[i]) for i in range(4)]
    _try(results, copy_bw, op, "cute kernel", nbytes, lambda: kern)
    _try(results, copy_bw, op, "twin (dequant+bmm)", nbytes, lambda: twin)
    if fmt == "fp4":
        _try(results, copy_bw, op, "_scaled_grouped_mm fp8 rowwise (fp8 weights!)", uniq * N * K,
             lambda: _grouped_mm_fns(N, K, R, idx[:4]), graph=False)


def _grouped_mm_fns(N, K, R, idx_list):
    """torch._scaled_grouped_mm with FP8 rowwise weights of the used experts, rows pre-grouped."""
    fns = []
    for idx in idx_list:
        ids = sorted(set(idx.tolist()))
        G = len(ids)
        wb = torch.randn(G, N, K, device="cuda").to(Q.E4M3)            # [G, N, K]
        counts = torch.bincount(idx, minlength=max(ids) + 1)[ids].to(torch.int32)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        a = torch.randn(R, K, device="cuda").to(Q.E4M3)
        sa = torch.rand(R, device="cuda") + 0.5
        sb = torch.rand(G, N, device="cuda") + 0.5
        fn = (lambda a=a, wb=wb, sa=sa, sb=sb, offs=offs:
              torch._scaled_grouped_mm(a, wb.transpose(-2, -1), sa, sb, offs=offs, out_dtype=torch.bfloat16))
        fn()
        fns.append(fn)
    return fns


def bench_dense(results, copy_bw, model, proj, M):
    d, inter, _ = MODELS[model]
    N, K = (inter, d) if proj == "w1" else (d, inter)
    copies = max(4, -(-(256 << 20) // (N * K)))  # rotate over > 4x L2 of weights
    ws = [(torch.randn(N, K, device="cuda") * 50).clamp(-448, 448).to(Q.E4M3) for _ in range(copies)]
    ss = [torch.randint(112, 132, (-(-N // 128), -(-K // 128)), dtype=torch.uint8, device="cuda").view(Q.E8M0)
          for _ in range(copies)]
    x = _rand_x(M, K)
    outs = [torch.empty(M, N, device="cuda") for _ in range(copies)]
    op = f"fp8 dense {model} {proj} N={N} K={K} M={M}"
    nbytes = N * K + ss[0].numel()
    _try(results, copy_bw, op, "cute kernel", nbytes,
         lambda: [lambda i=i: kernels.fp8_gemv(x, ws[i], ss[i], outs[i]) for i in range(copies)])
    _try(results, copy_bw, op, "twin (dequant+matmul)", nbytes,
         lambda: [lambda i=i: gemv.fp8_gemv_ref(x, ws[i], ss[i]) for i in range(min(copies, 4))])
    _try(results, copy_bw, op, "_scaled_mm blockwise 1x128/128x128", nbytes,
         lambda: _scaled_mm_fns(x, ws, ss))
    wb = [w.to(torch.bfloat16) for w in ws[: max(2, copies // 2)]]
    _try(results, copy_bw, op, "bf16 cuBLAS (2 B/param)", 2 * N * K,
         lambda: [lambda i=i: x @ wb[i].t() for i in range(len(wb))])


def _scaled_mm_fns(x, ws, ss):
    M, K = x.shape
    Mp = -(-M // 4) * 4  # cuBLASLt wants M % 4 == 0
    xq = torch.zeros(Mp, K, device="cuda", dtype=torch.bfloat16)
    xq[:M] = x.clamp(-448, 448)
    a = xq.to(Q.E4M3)
    sa = torch.ones(K // 128, Mp, device="cuda").t()  # [Mp, K/128], outer-dim major
    fns = []
    for w, s in zip(ws, ss):
        sb = Q.e8m0_to_float(s).t().contiguous()  # [K/128, N/128]
        fn = (lambda w=w, sb=sb: torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16))
        try:
            fn()
        except Exception:  # noqa: BLE001 - the other documented scale orientation
            sb2 = Q.e8m0_to_float(s).contiguous().t()
            fn = (lambda w=w, sb=sb2: torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16))
            fn()
        fns.append(fn)
    return fns


def sweep(results, copy_bw):
    """Tile choices for the headline case (FP4 grouped, Flash w1, batch 1)."""
    for nw, pd in ((1, 2), (2, 2), (4, 1), (4, 2), (4, 3), (2, 3)):
        launch.TUNE.update(nw=nw, pd=pd)
        d, inter, E = MODELS["flash"]
        N, K, R = inter, d, TOPK
        w = torch.randint(-128, 128, (E, N, K // 2), dtype=torch.int8, device="cuda")
        s = torch.randint(112, 132, (E, N, K // 32), dtype=torch.uint8, device="cuda").view(Q.E8M0)
        idx, uniq = _routing(E, 1, S)
        xs = [_rand_x(R, K) for _ in range(S)]
        outs = [torch.empty(R, N, device="cuda") for _ in range(S)]
        _try(results, copy_bw, f"sweep fp4 flash w1 batch=1 nw={nw} pd={pd}", "cute kernel",
             uniq * (N * K // 2 + N * K // 32),
             lambda: [lambda i=i: kernels.fp4_grouped_gemv(xs[i], w, s, idx[i], outs[i]) for i in range(S)])
    launch.TUNE.update(nw=None, pd=2)


# Flash batch-1 FP8 launches of one layer: (name, N, K, groups, activation rounded in the kernel); wo_a runs
# its 8 groups in one launch on bf16 activations (the released model does not round them)
FLASH_FP8 = (("wq_a+wkv", 1536, 4096, 1, True), ("wq_b", 32768, 1024, 1, True), ("wo_a 8 groups", 8192, 4096, 8, False),
             ("wo_b", 4096, 8192, 1, True), ("shared w1+w3", 4096, 4096, 1, True), ("shared w2", 4096, 2048, 1, True))


# The launch shapes tried at Flash's batch-1 shapes (launch.TUNE keys; {} = the launchers' own choice)
FP4_SHAPES = ({}, {"pd": 3}, {"warps": 8}, {"mma": 1}, {"mma": 1, "mma_warps": 2}, {"mma": 1, "mma_warps": 8},
              {"mma": 1, "mma_pd": 2}, {"mma": 1, "mma_pd": 4})
FP4_QUICK = ({"mma": 0}, {"mma": 1}, {"mma": 1, "mma_warps": 2}, {"mma": 1, "mma_warps": 1},
             {"mma": 1, "mma_pd": 4})  # the CUDA-core kernel, then the tensor-core kernel (depth 8 by default)
FP8_SHAPES = ({}, {"warps": 4, "pd8": 4, "rb8": 1}, {"pd8": 8, "rb8": 1}, {"pd8": 4, "rb8": 2},
              {"warps": 8, "pd8": 8, "rb8": 1}, {"warps": 8, "rb8": 2})


def _tuned(results, copy_bw, op, nbytes, make_fns, choice: dict):
    saved = dict(launch.TUNE)
    launch.TUNE.update(choice)
    try:
        shape = " ".join(f"{k}={v}" for k, v in choice.items()) or "default"
        _try(results, copy_bw, f"{op} {shape}", "cute kernel", nbytes, make_fns)
    finally:
        launch.TUNE.clear()
        launch.TUNE.update(saved)


def _copy_row(results, copy_bw, op, nbytes):
    """A device copy of the same bytes (read + write counted), chained as the kernels are: what a copy
    reaches at this size, next to the 1 GiB ceiling."""
    n = max(16, nbytes // 2)
    pairs = [(torch.empty(n, dtype=torch.int8, device="cuda"), torch.empty(n, dtype=torch.int8, device="cuda"))
             for _ in range(max(4, -(-(256 << 20) // n)))]
    _try(results, copy_bw, op, "copy of the same bytes", nbytes,
         lambda: [lambda a=a, b=b: b.copy_(a) for a, b in pairs])


def model_launches(results, copy_bw, fp4_shapes=({},), fp8_shapes=({},)):
    """The expert and FP8 launches of one Flash layer at batch 1, as the model makes them (w1|w3 as one
    bank read by one x row, w2 by the six rows' activations, activations rounded in the kernel), each
    next to a copy of the same bytes, at the given launch shapes."""
    d, inter, E = MODELS["flash"]
    for proj, N, K, xrows in (("w13", 2 * inter, d, 1), ("w2", d, inter, TOPK)):
        w = torch.randint(-128, 128, (E, N, K // 2), dtype=torch.int8, device="cuda")
        s = torch.randint(112, 132, (E, N, K // 32), dtype=torch.uint8, device="cuda").view(Q.E8M0)
        idx, uniq = _routing(E, 1, S)
        xs = [torch.randn(xrows, K, device="cuda").to(torch.bfloat16) for _ in range(S)]
        outs = [torch.empty(TOPK, N, device="cuda") for _ in range(S)]
        nbytes = int(uniq * (N * K // 2 + N * K // 32))
        op = f"fp4 flash {proj} N={N} K={K} rows={TOPK} x rows={xrows} quant"
        _copy_row(results, copy_bw, op, nbytes)
        for choice in fp4_shapes:
            _tuned(results, copy_bw, op, nbytes,
                   lambda: [lambda i=i: launch.fp4_grouped_gemv(xs[i], w, s, idx[i], outs[i], quant=True)
                            for i in range(S)], choice)
        del w, s
        torch.cuda.empty_cache()
    for name, N, K, G, quant in FLASH_FP8:
        copies = max(4, -(-(256 << 20) // (N * K)))
        ws = [(torch.randn(N, K, device="cuda") * 50).clamp(-448, 448).to(Q.E4M3) for _ in range(copies)]
        ss = [torch.randint(112, 132, (N // 128, K // 128), dtype=torch.uint8, device="cuda").view(Q.E8M0)
              for _ in range(copies)]
        x = torch.randn(G, K, device="cuda").to(torch.bfloat16)
        outs = [torch.empty(1, N, device="cuda") for _ in range(copies)]
        op, nbytes = f"fp8 flash {name} N={N} K={K} M=1{' quant' if quant else ''}", N * K + N * K // 16384
        _copy_row(results, copy_bw, op, nbytes)
        for choice in fp8_shapes:
            _tuned(results, copy_bw, op, nbytes,
                   lambda: [lambda i=i: launch.fp8_gemv(x, ws[i], ss[i], outs[i], groups=G, quant=quant)
                            for i in range(copies)], choice)
        del ws
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    args = argv or sys.argv[1:]
    quick = "--quick" in args
    dev = torch.cuda.get_device_name()
    copy_bw = copy_bandwidth()
    print(f"device {dev}; copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write)", flush=True)
    results: list[dict] = []
    if "--shapes" in args:  # the model's batch-1 launches over launch shapes
        model_launches(results, copy_bw, FP4_SHAPES, FP8_SHAPES)
    elif quick:  # the headline cases only (a short device lease)
        for batch in (1, 8):
            bench_grouped(results, copy_bw, "flash", "w1", batch, "fp4")
        bench_grouped(results, copy_bw, "pro", "w1", 1, "fp4")
        bench_grouped(results, copy_bw, "flash", "w1", 1, "nvfp4")
        model_launches(results, copy_bw, FP4_QUICK)
    else:
        for model in MODELS:
            for batch in (1, 8):
                for proj in ("w1", "w2"):
                    bench_grouped(results, copy_bw, model, proj, batch, "fp4")
                bench_grouped(results, copy_bw, model, "w1", batch, "nvfp4")
                for proj in ("w1", "w2"):
                    bench_dense(results, copy_bw, model, proj, batch)
                torch.cuda.empty_cache()
        sweep(results, copy_bw)
        model_launches(results, copy_bw, FP4_SHAPES, FP8_SHAPES)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "kernel_bench.json"), "w") as f:
            json.dump({"device": dev, "copy_TBps": copy_bw / 1e12, "results": results}, f, indent=1)
    _table(results, copy_bw, dev)
    return 0


def _table(results, copy_bw, dev):
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{dev}: weight bandwidth vs copy {copy_bw / 1e12:.2f} TB/s")
    for c in ("op", "impl", "us", "TB/s", "% copy"):
        t.add_column(c)
    for r in results:
        if r["us"] is None:
            t.add_row(r["op"], r["impl"], "-", "-", r["note"][:40])
        else:
            t.add_row(r["op"], r["impl"], f"{r['us']:.1f}", f"{r['TBps']:.2f}", f"{r['pct_copy']:.0f}")
    Console(width=200).print(t)


if __name__ == "__main__":
    raise SystemExit(main())
