"""Each decode layer's kernels in launch order, and a step-time A/B of settings (flash-h200, first N layers).

The bench's family table says how many kernels a step runs; this says which, layer by layer, so a
fusion can be aimed at the launches that are there (dsv4/kernels/NOTES.md, session 9). Needs CUDA
(and the CuTe DSL for the batch-1 weight kernels).
    NL=5 BATCHES=1,16 CONFIGS=default,nopdl OUT=/tmp/o python tests/gpu_layer_kernels.py
CONFIGS: `default`, `nopdl` (DSV4_PDL=0), `nomixes` (DSV4_TRITON_MIXES=0), or NAME=VAR:VALUE+VAR:VALUE.
LIST=0 skips the layer listing, LIST=2 prints its kernels; MERGE=1 adds this run's rows to an existing $OUT/layer_kernels.json; CTX=16384
times the step at that context (random cache entries, as the bench's long-context rows).
Per config and batch: build time, graph-vs-eager bitwise check, median step ms (timed in rounds across
the configs, before any profiling), kernels per step; for the first config, every layer captured alone
with its kernels listed (name, us) in $OUT/layer_kernels.json.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import dsv4
from dsv4 import kernels
from dsv4.decode.graph import CUDAGraphDecoder
from dsv4.decode.verify import verify_replay
from dsv4.kernels.bench import event_times

PRESETS = {"default": {}, "nopdl": {"DSV4_PDL": "0"}, "nomixes": {"DSV4_TRITON_MIXES": "0"}}


def settings(name: str) -> dict:
    if name in PRESETS:
        return PRESETS[name]
    _, _, spec = name.partition("=")
    return dict(kv.split(":", 1) for kv in spec.split("+") if kv)


def ordered(run) -> list[tuple[str, float]]:
    """(kernel name, us) of one call of run, in launch order (after three warm calls)."""
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    evs = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA), key=lambda e: e.time_range.start)
    return [(e.name[:110], round(e.time_range.elapsed_us(), 2)) for e in evs]


def layer_listing(dec: CUDAGraphDecoder) -> dict[str, list]:
    st = dec.static
    X0 = st.net.embed(st.ids)
    out = {}
    for i, layer in enumerate(st.net.layers):
        graph, _ = dec._capture(st.device, lambda L=layer: L(X0, st.ids[:, None], st.pos))
        routing = "hash" if layer.block.ffn.gate.hash else "learned"
        out[f"L{i}-ratio{layer.block.attn.ratio}-{routing}"] = ordered(graph.replay)
        del graph
    return out


def measure(decs: dict, res: dict, first: str) -> None:
    """Step times of every decoder, timed in rounds across the settings before any profiler session (once
    CUPTI has been attached, later replays run slower: session 12 saw ~9% on every setting after the first
    profiled one), then the first setting's layer listing."""
    base = dict(os.environ)
    times = {k: [] for k in decs}
    for _ in range(4):
        for key, dec in decs.items():
            times[key] += event_times(dec.step, 10)
    for key, dec in decs.items():
        row = res[key] | {"step_ms": round(statistics.median(times[key]), 4), "kernels": len(ordered(dec.step))}
        if key.startswith(first + "-") and os.environ.get("LIST", "1") != "0":  # layer by layer, under its variables
            os.environ.update(settings(first))
            row["layers"] = layer_listing(dec)
            os.environ.clear()
            os.environ.update(base)
        res[key] = row
        print(f"{key:>12} build {row['build_s']:6.1f} s  bitwise {row['bitwise']}  "
              f"step {row['step_ms']:.3f} ms  kernels {row['kernels']}", flush=True)
        for layer, ks in row.get("layers", {}).items():
            ours = sum(1 for k, _ in ks if not k.startswith("triton_"))
            print(f"{'':>12} {layer:24s} {len(ks):4d} kernels ({len(ks) - ours} inductor)  {sum(u for _, u in ks):7.1f} us")
            for name, us in ks if os.environ.get("LIST") == "2" else ():  # LIST=2: every kernel, in order
                print(f"{'':>16} {us:7.2f} us  {name[:110]}")


@torch.no_grad()
def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("gpu_layer_kernels: needs CUDA")
    out = os.environ.get("OUT", "/tmp")
    configs = os.environ.get("CONFIGS", "default").split(",")
    batches = [int(b) for b in os.environ.get("BATCHES", "1").split(",")]
    kernels.use(True)
    ctx = int(os.environ.get("CTX", "0"))  # 0: an 8-token prompt; else a cache filled up to CTX (start_at)
    runtime = {"max_seq_len": ctx + 256} if ctx else {}
    model = dsv4.load("flash-h200", device="cuda", dtype="bfloat16", seed=0, n_layers=int(os.environ.get("NL", "5")),
                      **runtime)
    res, base = {}, dict(os.environ)
    for B in batches:  # the decoders of one batch size share the model's caches; the next size replaces them
        decs = {}
        for name in configs:  # every setting acts when its graphs are built; replays do not read it
            os.environ.clear()
            os.environ.update(base | settings(name))
            torch._dynamo.reset()  # inductor options are read at compile time
            t0 = time.time()
            dec = CUDAGraphDecoder(model, mode="full", batch_size=B, fuse=True)
            res[f"{name}-B{B}"] = {"build_s": round(time.time() - t0, 1), "bitwise": verify_replay(dec, steps=4).ok}
            if ctx:
                dec.start_at(ctx, torch.Generator().manual_seed(0))
            else:
                dec.prefill(torch.randint(0, model.cfg.vocab_size, (B, 8)))
            dec.stage(torch.randint(0, model.cfg.vocab_size, (B,)))
            decs[f"{name}-B{B}"] = dec
        os.environ.clear()
        os.environ.update(base)
        measure(decs, res, configs[0])
        del decs, dec
        torch.cuda.empty_cache()
    path = os.path.join(out, "layer_kernels.json")
    if os.environ.get("MERGE") == "1" and os.path.exists(path):  # one process per setting, rows gathered
        with open(path) as f:
            res = json.load(f) | res
    with open(path, "w") as f:
        json.dump(res, f, indent=0)


if __name__ == "__main__":
    main()
