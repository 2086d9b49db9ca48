"""Where a decode step's time goes: per layer (eager, and each layer alone under a graph) and per kernel.

- `per_layer_profile`: the eager static step, CUDA events around each layer (host launch cost
  included: what eager decoding pays per layer).
- `layer_graph_profile`: each layer of a built decoder captured alone and replayed; its GPU time
  under a graph, by compress ratio (0 / 4 / 128) and routing (hash / learned).
- `kernel_profile`: the kernels one step runs (a replay shows its graph's nodes), by total time.
"""

from __future__ import annotations

import contextlib
import statistics

import torch


def _tags(block) -> dict:
    return {"ratio": block.attn.ratio, "routing": "hash" if block.ffn.gate.hash else "learned"}


def per_layer_profile(model, batch: int, steps: int = 5) -> list[dict]:
    """Eager static step timed per layer with CUDA events; tagged by compress ratio and routing."""
    from dsv4.decode.static import StaticDecoder

    dec = StaticDecoder(model, batch_size=batch)
    dec.prefill(torch.randint(0, model.cfg.vocab_size, (batch, 8)))
    dec.stage(torch.randint(0, model.cfg.vocab_size, (batch,)))
    acc = [0.0] * len(dec.net.layers)
    for s in range(steps + 1):
        X = dec.net.embed(dec.ids)
        for i, layer in enumerate(dec.net.layers):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            X = layer(X, dec.ids[:, None], dec.pos)
            b.record()
            b.synchronize()
            if s:
                acc[i] += a.elapsed_time(b) / steps
        dec.pos.add_(1)
    return [{"layer": i, **_tags(block), "ms": acc[i]} for i, block in enumerate(model.layers)]



@torch.no_grad()
def layer_graph_profile(dec, reps: int = 7) -> list[dict]:
    """Each layer of `dec` (a built CUDAGraphDecoder; fused if it was) captured alone and replayed
    `reps` times; median GPU ms per layer. Replays rewrite the caches: call it after the timing."""
    from dsv4.kernels.bench import event_times

    static = dec.static
    X0 = static.net.embed(static.ids)
    out = []
    for i, layer in enumerate(static.net.layers):
        dev = layer.block.device
        X, ids, pos = X0.to(dev), static.ids[:, None].to(dev), static.pos.to(dev)
        graph, _ = dec._capture(dev, lambda L=layer, X=X, ids=ids, pos=pos: L(X, ids, pos))
        with torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext():
            ms = statistics.median(event_times(graph.replay, reps))
        out.append({"layer": i, **_tags(layer.block), "ms": ms})
        del graph
    return out


def kernel_profile(step, steps: int = 3, top: int | None = None, cuda: bool = True) -> list[dict]:
    """What `step` runs, by total time: GPU kernels (a graph replay shows its nodes), or on the CPU the
    ops by self time. Rows: name, launches per step, microseconds per step; the first row sums them all
    (every kernel is kept unless `top` is given, so `families` can partition the step)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    agg: dict[str, list[float]] = {}
    for ev in prof.events():
        if cuda:
            keep, us = ev.device_type == DeviceType.CUDA, ev.time_range.elapsed_us()  # one kernel's duration
        else:
            keep, us = ev.device_type == DeviceType.CPU, ev.self_cpu_time_total  # self times partition the step
        if keep and us > 0:
            a = agg.setdefault(ev.name, [0, 0.0])
            a[0] += 1
            a[1] += us
    rows = [{"kernel": k[:90], "per_step": n / steps, "us_per_step": t / steps} for k, (n, t) in agg.items()]
    rows.sort(key=lambda r: -r["us_per_step"])
    total = {"kernel": "(all)", "per_step": sum(r["per_step"] for r in rows),
             "us_per_step": sum(r["us_per_step"] for r in rows)}
    return [total] + rows[:top]


# kernel name pattern -> family, first match wins; what matches none is "other (ATen, copies)"
FAMILIES = (
    (r"^triton_", "inductor-fused pointwise/reductions"),  # first: their names quote the custom ops they feed
    (r"^_bf16_gemv", "bf16 GEMV (Triton)"),
    (r"cutlass_fp8|^_fp8_gemm_kernel", "FP8 weights (CuTe GEMV, Triton GEMM)"),
    (r"cutlass_(nv)?fp4|^_experts_kernel|^_group_kernel", "FP4 experts (CuTe, Triton)"),
    (r"^_(sinkhorn|comb|mix_sums|sparse_attention|topk_\w+|entry|token|qkv|index_q|gate)_kernel|^_split_(stats|out|sum)$",
     "layer kernels (Triton: mHC, attention, top-k)"),
    (r"[Tt]op[Kk]|[Ss]ort", "top-k / sort"),
    (r"gemm|gemv|xmma|splitK|dot_kernel|cublas", "cuBLAS/CUTLASS GEMM"),
)
# the weight-reading families and the kind of weight bytes each reads (BenchResult.bytes_by_kind)
FAMILY_BYTES = {"bf16 GEMV (Triton)": "bf16", "FP8 weights (CuTe GEMV, Triton GEMM)": "fp8",
                "FP4 experts (CuTe, Triton)": "experts"}


def families(profile: list[dict]) -> dict[str, dict]:
    """A kernel profile summed by family: {family: {"per_step", "us_per_step"}}. A profile stored with
    only its top kernels leaves a remainder, reported as "not itemized"."""
    import re

    out: dict[str, dict] = {}
    for k in profile[1:]:
        fam = next((f for pat, f in FAMILIES if re.search(pat, k["kernel"])), "other (ATen, copies)")
        acc = out.setdefault(fam, {"per_step": 0.0, "us_per_step": 0.0})
        acc["per_step"] += k["per_step"]
        acc["us_per_step"] += k["us_per_step"]
    rest = {key: profile[0][key] - sum(v[key] for v in out.values()) for key in ("per_step", "us_per_step")}
    if rest["us_per_step"] > 1e-6 * max(profile[0]["us_per_step"], 1):
        out["not itemized"] = rest
    return out


