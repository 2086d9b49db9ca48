"""Eager vs A/B graph vs full graph vs torch.compile decode, against the memory-bandwidth floor.

Decode at small batch is memory-bound: a step cannot be faster than the weight bytes it reads
over the copy bandwidth. The bench measures that ceiling in the same run (a device-to-device
copy), counts the weight bytes one decode step reads (dense weights once, the experts actually
routed to), times each mode per step with CUDA events, and checks every graph mode bitwise
against eager before timing it (audit/bench/modes.py builds and times one row). The kernels
switch is on for the whole run where CUDA is, so every mode reads the weights the same way.
The report is written by audit/bench/report.py.
"""

from __future__ import annotations

import os
import subprocess
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from audit.bench.modes import profile_row, run_mode, summarize
from audit.bench.profile import per_layer_profile
from audit.bench.result import BenchResult, ModeResult
from audit.errors import AuditError

MODES = ("eager", "ab", "full", "compile")


# ------------------------------------------------------------------ measurements


def copy_bandwidth(device: torch.device, nbytes: int = 2 << 30, reps: int = 10) -> float:
    """Device-to-device copy, bytes read + written per second (TB/s)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize(device)
    return 2 * nbytes * reps / (start.elapsed_time(end) * 1e-3) / 1e12


def _nbytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def weight_bytes_by_kind(model, batch: int) -> dict[str, int]:
    """Weight bytes one decode step reads, by the kernel family that reads them: "fp8" (FP8 Linears),
    "bf16" (bf16 Linears and the LM head), "experts" (the routed experts a batch is expected to touch),
    "other" (norms, mHC, sinks, gate tables, the embedding rows).

    With k of E experts per token and uniform routing, a batch of B tokens touches
    E * (1 - (1 - k/E)^B) distinct experts per layer. The embedding reads one row per token.
    """
    from dsv4.layers.linear import Linear

    cfg = model.cfg
    out = {"fp8": 0, "bf16": 0, "experts": 0, "other": 0}
    distinct = cfg.n_routed_experts * (1 - (1 - cfg.n_activated_experts / cfg.n_routed_experts) ** batch)
    for layer in model.layers:
        experts = layer.ffn.experts
        out["experts"] += int(distinct * _nbytes(experts[0]))
        routed = {id(p) for p in experts.parameters()}
        linear = set()
        for mod in layer.modules():
            if isinstance(mod, (Linear, torch.nn.Linear)) and not any(id(p) in routed for p in mod.parameters()):
                fmt = getattr(mod, "fmt", "bf16")
                out["fp8" if fmt == "fp8" else "bf16" if fmt == "bf16" else "other"] += _nbytes(mod)
                linear |= {id(p) for p in mod.parameters()}
        out["other"] += sum(p.numel() * p.element_size() for p in layer.parameters()
                            if id(p) not in routed and id(p) not in linear)
        out["other"] -= layer.ffn.gate.tid2eid.numel() * 8 if layer.ffn.gate.hash else 0
    head = model.head.weight
    out["bf16"] += head.numel() * head.element_size()
    out["other"] += _nbytes(model.norm) + batch * cfg.dim * model.embed.weight.element_size()
    return out


def weight_bytes_per_step(model, batch: int) -> int:
    """All weight bytes one decode step reads (the floor's numerator): the sum of weight_bytes_by_kind."""
    return sum(weight_bytes_by_kind(model, batch).values())


def bench(preset: str = "flash-h200", modes=MODES, steps: int = 64, batches=(1,), contexts=None,
          device: str = "cuda", n_layers: int | None = None, dtype: str = "bfloat16", verify_steps: int = 8,
          seed: int = 0, progress=None, kernels: bool | None = None, fuse: bool = True,
          on_row=None, isolate: bool | None = None, layer_profile: bool = True) -> BenchResult:
    """Every (batch, context, mode) row; `kernels` None = on where CUDA is (the dsv4 switch otherwise);
    `contexts` None = 1024, or the longest the preset holds when that is less. `on_row(result)` is
    called after each row (the CLI saves the JSON there, so a run cut short keeps what it measured);
    a row that raises is recorded with the error as its note and the run goes on. `isolate` None = each
    (batch, context) group in a process of its own where CUDA is and there is more than one group
    (audit/bench/isolate.py); `layer_profile`: the eager per-layer table (the first group's batch)."""
    import dsv4

    limit = dsv4.preset(preset).max_position_embeddings
    contexts = contexts or [min(1024, limit - _capacity(0, steps))]

    bad = [m for m in modes if m not in MODES]
    if bad:
        raise AuditError(f"unknown bench mode {bad[0]!r}; choose from {', '.join(MODES)}")
    if any(b < 1 for b in batches) or any(c < 1 for c in contexts) or steps < 1:
        raise AuditError("--batch, --context and --steps must be positive")
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise AuditError("--device cuda requested but CUDA is not available; use --device cpu (eager only)")
    runtime = {"max_seq_len": _capacity(max(contexts), steps), "max_batch_size": max(batches)}
    if n_layers:
        runtime["n_layers"] = n_layers
    if runtime["max_seq_len"] > limit:
        raise AuditError(f"context {max(contexts)} + {steps} steps does not fit {preset}'s "
                         f"{limit} positions; the longest context it takes is {limit - _capacity(0, steps)}")
    groups = [(b, c) for c in contexts for b in batches]
    if isolate or (isolate is None and cuda and len(groups) > 1):
        from audit.bench.isolate import run_groups

        same = dict(preset=preset, modes=modes, steps=steps, device=device, n_layers=n_layers, dtype=dtype,
                    verify_steps=verify_steps, seed=seed, kernels=kernels, fuse=fuse)
        return run_groups(bench, groups, modes, same, progress, on_row)
    with warnings.catch_warnings(record=True) as caught:  # library warnings go to the report, not the terminal
        warnings.simplefilter("default")
        return _measure(preset, modes, steps, batches, contexts, dev, dtype, verify_steps, seed, progress, kernels,
                        fuse, on_row, runtime, caught, layer_profile)


def _measure(preset, modes, steps, batches, contexts, dev, dtype, verify_steps, seed, progress, kernels, fuse,
             on_row, runtime, caught, layer_profile=True) -> BenchResult:
    import dsv4

    cuda = dev.type == "cuda"
    model = dsv4.load(preset, device=dev, dtype=dtype, seed=seed, **runtime)
    use_kernels = cuda if kernels is None else kernels
    res = BenchResult(preset, str(torch.cuda.get_device_name(dev) if cuda else "cpu"), model.cfg.n_layers,
                      dtype, steps, copy_bandwidth(dev) if cuda else None, kernels=use_kernels)
    rng = torch.Generator().manual_seed(seed)
    commit = source_commit()
    for b in batches:
        res.bytes_by_kind[str(b)] = weight_bytes_by_kind(model, b)
        res.weight_bytes[str(b)] = sum(res.bytes_by_kind[str(b)].values())
    with _kernels(use_kernels):
        if cuda and layer_profile:
            res.per_layer = per_layer_profile(model, batches[0])
        for ctx in contexts:
            model.cfg.max_seq_len = _capacity(ctx, steps)  # each context gets a decoder sized for it
            for b in batches:
                for mode in modes:
                    res.rows.append(_row(model, mode, b, ctx, steps, verify_steps, rng, cuda, fuse))
                    res.rows[-1].commit, res.rows[-1].copy_tb_s = commit, res.copy_tb_s
                    if cuda:
                        torch.cuda.empty_cache()  # the row's graphs and pools are gone
                    res.warnings = warning_lines(caught)
                    if on_row:
                        on_row(res)
                    if progress:
                        progress()
        for row in [r for r in res.rows if cuda and r.mode == "full" and r.ms_median is not None]:
            model.cfg.max_seq_len = _capacity(row.context, steps)  # profiled after every timing: see profile_row
            profile_row(model, row, rng)
            torch.cuda.empty_cache()
            if on_row:
                on_row(res)
            if progress:
                progress()
    return res


def warning_lines(caught) -> list[str]:
    """The distinct warnings a run raised, one line each: category, first line of the message, where."""
    lines = {f"{w.category.__name__}: {str(w.message).strip().splitlines()[0][:200]} "
             f"({Path(w.filename).name}:{w.lineno})" for w in caught}
    return sorted(lines)


def source_commit() -> str:
    """The git HEAD of the measured source tree, "+dirty" when it has local changes; "" outside git.
    DSV4_BENCH_COMMIT names it instead, for a copy of the tree whose git metadata is not its own."""
    if os.environ.get("DSV4_BENCH_COMMIT", "").strip():
        return os.environ["DSV4_BENCH_COMMIT"].strip()
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10, check=False).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("+dirty" if head and dirty else "")


def _capacity(context: int, steps: int) -> int:
    """max_seq_len for a row: the context, the timed and warmup steps, the verify prompt, slack."""
    return context + steps + 64 + 64


def _row(model, mode, batch, ctx, steps, verify_steps, rng, cuda, fuse) -> ModeResult:
    if not cuda:
        if mode != "eager":
            return ModeResult(mode, batch, ctx, note="graph modes need CUDA")
        return _cpu_eager(model, batch, ctx, steps, rng)
    try:
        row = run_mode(model, mode, batch, ctx, steps, verify_steps, rng, fuse)
        extra = os.environ.get("DSV4_INDUCTOR", "")
        notes = [f"inductor {extra}"] if extra and fuse and mode in ("full", "ab") else []
        from dsv4.kernels.ops import settings

        notes.append(settings())  # Triton GEMM switches moved from their defaults, if any
        row.note = "; ".join(filter(None, (row.note, *notes)))
        return row
    except Exception as e:  # noqa: BLE001 - one row failing is a result: reported in its note, the run goes on
        return ModeResult(mode, batch, ctx, note=f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")


@contextmanager
def _kernels(flag: bool):
    from dsv4 import kernels

    before = kernels.use(flag)
    try:
        yield
    finally:
        kernels.use(before)


def _cpu_eager(model, batch: int, context: int, steps: int, rng) -> ModeResult:
    """The static path on the CPU, timed with the host clock (no graphs without CUDA)."""
    from dsv4.decode.static import StaticDecoder

    row = ModeResult("eager", batch, context, note="CPU, host clock")
    dec = StaticDecoder(model, batch_size=batch)
    dec.start_at(context, rng)
    dec.stage(torch.randint(0, model.cfg.vocab_size, (batch,), generator=rng))
    dec.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        dec.step()
        times.append((time.perf_counter() - t0) * 1e3)
    summarize(row, times)
    return row
