"""Tile sweeps for the Triton batched GEMMs: `python -m dsv4.kernels.tune` on a GPU (not a test).

Each kernel module keeps a `TUNE` dict of overrides (empty: the built-in `tiles()` rules). A sweep sets
them in-process, times each configuration as a CUDA graph of calls over weight copies worth >= 256 MB
(HBM, not L2), and prints the best per shape, as the DSV4_TRITON_TUNE value that would apply it
('{"fp8": {...}, "experts": {...}}'; read when the kernel modules are imported, recorded in bench notes).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics

import torch


def _graph_us(calls) -> float:
    """us per call: the calls captured in one graph, replay timed by CUDA events (median of 5)."""
    for c in calls[:2]:
        c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(calls))
    return statistics.median(times)


def _report(r: dict) -> dict:
    cfg = "default" if r["cfg"] == {} else json.dumps(r["cfg"])
    print(f"{r['kind']:8s} {r['shape']:14s} rows {r['rows']:3d} {r['us']:8.1f} us {r['GB/s']:6.0f} GB/s {cfg}", flush=True)
    return r


def sweep_fp8(shapes, rows, space) -> list[dict]:
    from dsv4.kernels import _triton_fp8 as F
    from dsv4.ops.quantize import quantize_fp8_blockwise

    out = []
    for (N, K, G), M in itertools.product(shapes, rows):
        copies = max(1, -(-(256 << 20) // (N * K)))
        ws = [quantize_fp8_blockwise(torch.randn(N, K, device="cuda") * 0.02) for _ in range(copies)]
        x = torch.randn(M * G, K, device="cuda").bfloat16()
        y = torch.empty(M, N, device="cuda")
        for cfg in space:
            F.TUNE.clear()
            F.TUNE.update(cfg)
            try:
                us = _graph_us([lambda w=w: F.fp8_gemm(x, *w, groups=G, out=y, quant=True) for w in ws * 2][:48])
            except Exception as e:  # noqa: BLE001 - a configuration that does not compile is a result
                us = float("nan")
                print("fp8", N, K, G, M, cfg, type(e).__name__)
            out.append(_report({"kind": "fp8", "shape": f"{N}x{K}/G{G}", "rows": M, "cfg": dict(cfg), "us": us,
                                "GB/s": N * K / us / 1e3}))
        del ws
    F.TUNE.clear()
    return out


def sweep_experts(shapes, rows, space, E: int = 32) -> list[dict]:
    from dsv4.kernels import _triton_experts as T
    from dsv4.ops import quantize as Q

    out = []
    for (N, K), R in itertools.product(shapes, rows):
        w, s = zip(*(Q.quantize_fp4(torch.randn(N, K, device="cuda") * 0.02) for _ in range(E)))
        w, s = torch.stack(w), torch.stack(s)
        per_expert = N * K // 2 + N * K // 32
        x = Q.fp8_fake_quant(torch.randn(R, K, device="cuda").bfloat16(), 128)
        idxs = [torch.stack([torch.randperm(E)[:6] for _ in range(R // 6)]).flatten().cuda() for _ in range(24)]
        distinct = statistics.mean(len(set(i.tolist())) for i in idxs)
        y = torch.empty(R, N, device="cuda")
        for cfg in space:
            T.TUNE.clear()
            T.TUNE.update(cfg)
            try:
                us = _graph_us([lambda i=i: T.grouped_expert_gemm("fp4", x, w, s, i, out=y) for i in idxs])
            except Exception as e:  # noqa: BLE001
                us = float("nan")
                print("experts", N, K, R, cfg, type(e).__name__)
            out.append(_report({"kind": "experts", "shape": f"{N}x{K}", "rows": R, "cfg": dict(cfg), "us": us,
                                "GB/s": distinct * per_expert / us / 1e3}))
        del w, s
    T.TUNE.clear()
    return out


def main() -> None:
    fp8_space = [{}] + [dict(bn=bn, target=t) for bn, t in itertools.product((32, 64, 128), (264, 528))]
    ex_space = [{}] + [dict(bn=bn, bk=bk, warps=w, stages=st) for bn, bk, w, st in itertools.product(
        (32, 64, 128), (128, 256), (4, 8), (3,))]
    rows = sweep_fp8([(4096, 4096, 1), (1536, 4096, 1), (8192, 1024, 8), (4096, 2048, 1)], (1, 16), fp8_space)
    rows += sweep_experts([(4096, 4096), (4096, 2048)], (6, 96), ex_space)
    best: dict = {}
    for r in rows:
        key = (r["kind"], r["shape"], r["rows"])
        if r["us"] == r["us"] and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    print("\nbest per shape:")
    for (kind, shape, n), r in sorted(best.items()):
        base = next(x for x in rows if (x["kind"], x["shape"], x["rows"], x["cfg"]) == (kind, shape, n, {}))
        print(f"{kind:8s} {shape:14s} rows {n:3d} {r['us']:8.1f} us (default {base['us']:.1f}) {json.dumps(r['cfg'])}")
    pick = {}
    for kind, n in (("fp8", 16), ("experts", 96)):  # one setting per kind, for the batch-16 rows
        cands = [r for r in rows if r["kind"] == kind and r["rows"] == n]
        totals: dict = {}
        for r in cands:
            totals.setdefault(json.dumps(r["cfg"], sort_keys=True), []).append(r["us"])
        ok = {k: sum(v) for k, v in totals.items() if all(u == u for u in v)}
        if ok:
            best_cfg = min(ok, key=ok.get)
            print(f"{kind} at {n} rows: default {ok.get('{}', float('nan')):.1f} us over the shapes, "
                  f"best {ok[best_cfg]:.1f} us with {best_cfg}")
            if best_cfg != "{}" and ok[best_cfg] < 0.97 * ok.get("{}", float("inf")):
                pick[kind] = json.loads(best_cfg)
    print("DSV4_TRITON_TUNE=" + json.dumps(pick))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "tune.json"), "w") as f:
            json.dump(rows, f, indent=1)
        with open(os.path.join(os.environ["OUT"], "tune.env"), "w") as f:
            f.write(json.dumps(pick) if pick else "")


if __name__ == "__main__":
    main()
