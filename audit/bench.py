"""Eager vs A/B graph vs full graph vs torch.compile decode, against the memory-bandwidth floor.

Decode at small batch is memory-bound: a step cannot be faster than the weight bytes it reads
over the copy bandwidth. The bench measures that ceiling in the same run (a device-to-device
copy), counts the weight bytes one decode step reads (dense weights once, the experts actually
routed to), times each mode per step with CUDA events, and checks every graph mode bitwise
against eager before timing it. The report is written by audit/bench_report.py.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from audit.errors import AuditError

MODES = ("eager", "ab", "full", "compile")


@dataclass
class ModeResult:
    mode: str
    batch: int
    context: int
    ms_median: float | None = None
    ms_p10: float | None = None
    ms_p90: float | None = None
    tokens_per_s: float | None = None
    bitwise_ok: bool | None = None
    note: str = ""
    skip_reasons: list[str] = field(default_factory=list)


@dataclass
class BenchResult:
    preset: str
    device: str
    n_layers: int
    dtype: str
    steps: int
    copy_tb_s: float | None
    weight_bytes: dict = field(default_factory=dict)  # batch -> bytes read per decode step
    rows: list[ModeResult] = field(default_factory=list)
    per_layer: list[dict] = field(default_factory=list)
    torch_version: str = torch.__version__

    def to_json(self) -> dict:
        return asdict(self)


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


def weight_bytes_per_step(model, batch: int) -> int:
    """Dense weights read once per step, plus the routed experts a batch is expected to touch.

    With k of E experts per token and uniform routing, a batch of B tokens touches
    E * (1 - (1 - k/E)^B) distinct experts per layer. The embedding reads one row per token.
    """
    cfg = model.cfg
    total = 0
    for layer in model.layers:
        experts = layer.ffn.experts
        per_expert = _nbytes(experts[0])
        distinct = cfg.n_routed_experts * (1 - (1 - cfg.n_activated_experts / cfg.n_routed_experts) ** batch)
        total += _nbytes(layer) - len(experts) * per_expert + distinct * per_expert
        total -= layer.ffn.gate.tid2eid.numel() * 8 if layer.ffn.gate.hash else 0
    head = model.head.weight
    total += head.numel() * head.element_size() + _nbytes(model.norm)
    total += batch * cfg.dim * model.embed.weight.element_size()
    return int(total)


def _timed(step, steps: int, device) -> list[float]:
    times = []
    for _ in range(steps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        step()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return times


def _summarize(row: ModeResult, times: list[float]) -> None:
    q = statistics.quantiles(times, n=10) if len(times) >= 10 else [min(times), max(times)]
    row.ms_median = statistics.median(times)
    row.ms_p10, row.ms_p90 = q[0], q[-1]
    row.tokens_per_s = row.batch * 1e3 / row.ms_median


class _SkipReasons(logging.Handler):
    """Collects inductor's 'skipping cudagraphs due to ...' log lines."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.reasons: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if "skipping cudagraphs" in msg.lower():
            self.reasons.append(msg.strip())


# ------------------------------------------------------------------ one configuration


def run_mode(model, mode: str, batch: int, context: int, steps: int, verify_steps: int, rng) -> ModeResult:
    """Builds the decoder for `mode`, prefills `context` tokens, verifies, and times `steps` steps."""
    from dsv4.decode.graph import CUDAGraphDecoder
    from dsv4.decode.verify import verify_replay

    row = ModeResult(mode, batch, context)
    V = model.cfg.vocab_size
    prompt = torch.randint(0, V, (batch, context), generator=rng)
    ids = torch.randint(0, V, (batch,), generator=rng)
    dev = model.device
    if mode == "compile":
        return _run_compile(model, row, prompt, ids, steps)
    dec = CUDAGraphDecoder(model, mode=mode, batch_size=batch)
    if mode != "eager" and verify_steps:
        res = verify_replay(dec, steps=verify_steps, prompt_len=min(context, 16), seed=int(ids[0]))
        row.bitwise_ok = res.ok
        if not res.ok:
            row.note = res.first_mismatch or "replay differs from eager"
    dec.prefill(prompt)
    dec.stage(ids)
    times = _timed(lambda: dec.step(), steps + 3, dev)[3:]
    _summarize(row, times)
    return row


def _run_compile(model, row: ModeResult, prompt, ids, steps: int) -> ModeResult:
    """torch.compile(mode="reduce-overhead") over the static path: the peer a user would pick."""
    from dsv4.decode.static import StaticDecoder

    dec = StaticDecoder(model, batch_size=row.batch)
    compiled = torch.compile(dec.net, mode="reduce-overhead")
    handler = _SkipReasons()
    loggers = [logging.getLogger(n) for n in ("torch._inductor", "torch._inductor.cudagraph_trees",
                                                 "torch._inductor.perf_hints")]
    old = [(lg, lg.level) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    try:
        dec.prefill(prompt)
        dec.stage(ids)

        def step():
            out = compiled(dec.ids, dec.pos)
            dec.pos.add_(1)
            return out

        t0 = time.perf_counter()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        row.note = f"compile+warmup {time.perf_counter() - t0:.0f} s"
        _summarize(row, _timed(step, len(range(steps)), model.device))
    except Exception as e:  # report, don't hide: the peer failing is a result too
        row.note = f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    finally:
        for lg, lvl in old:
            lg.removeHandler(handler)
            lg.setLevel(lvl)
        torch._dynamo.reset()
    row.skip_reasons = sorted(set(handler.reasons))
    return row


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
    out = []
    for i, layer in enumerate(model.layers):
        out.append({"layer": i, "ratio": layer.attn.ratio,
                    "routing": "hash" if layer.ffn.gate.hash else "learned", "ms": acc[i]})
    return out


def bench(preset: str = "flash-h200", modes=("eager", "ab", "full", "compile"), steps: int = 64,
          batches=(1,), contexts=(16,), device: str = "cuda", n_layers: int | None = None,
          dtype: str = "bfloat16", verify_steps: int = 8, seed: int = 0, progress=None) -> BenchResult:
    import dsv4

    bad = [m for m in modes if m not in MODES]
    if bad:
        raise AuditError(f"unknown bench mode {bad[0]!r}; choose from {', '.join(MODES)}")
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise AuditError("--device cuda requested but CUDA is not available; use --device cpu (eager only)")
    runtime = {"max_seq_len": max(contexts) + steps + 3 * 16 + 64, "max_batch_size": max(batches)}
    if n_layers:
        runtime["n_layers"] = n_layers
    model = dsv4.load(preset, device=dev, dtype=dtype, seed=seed, **runtime)
    res = BenchResult(preset, str(torch.cuda.get_device_name(dev) if cuda else "cpu"), model.cfg.n_layers,
                      dtype, steps, copy_bandwidth(dev) if cuda else None)
    rng = torch.Generator().manual_seed(seed)
    for b in batches:
        res.weight_bytes[str(b)] = weight_bytes_per_step(model, b)
    for b in batches:
        for ctx in contexts:
            for mode in modes:
                if not cuda and mode != "eager":
                    res.rows.append(ModeResult(mode, b, ctx, note="graph modes need CUDA"))
                elif not cuda:
                    res.rows.append(_cpu_eager(model, b, ctx, steps, rng))
                else:
                    res.rows.append(run_mode(model, mode, b, ctx, steps, verify_steps, rng))
                if progress:
                    progress()
    if cuda:
        res.per_layer = per_layer_profile(model, batches[0])
    return res


def _cpu_eager(model, batch: int, context: int, steps: int, rng) -> ModeResult:
    """The static path on the CPU, timed with the host clock (no graphs without CUDA)."""
    from dsv4.decode.static import StaticDecoder

    row = ModeResult("eager", batch, context, note="CPU, host clock")
    dec = StaticDecoder(model, batch_size=batch)
    dec.prefill(torch.randint(0, model.cfg.vocab_size, (batch, context), generator=rng))
    dec.stage(torch.randint(0, model.cfg.vocab_size, (batch,), generator=rng))
    dec.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        dec.step()
        times.append((time.perf_counter() - t0) * 1e3)
    _summarize(row, times)
    return row
