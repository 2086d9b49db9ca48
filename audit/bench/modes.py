"""One bench row: build the decoder of a mode, bring it to the context, check it, time it.

- eager: CUDAGraphDecoder(mode="eager"), the static path op by op (unfused), the baseline.
- ab / full: our graphs; with `fuse` the layers' pointwise work is compiled by inductor first
  (dsv4/decode/fuse.py). Every graph row is checked bitwise against the eager run of the same
  (fused) functions, and a fused row also against the unfused static path (`drift`, relative).
- compile: torch.compile(mode="reduce-overhead") over the static path, the peer a user would
  otherwise pick: each layer compiled on its own (identical layers share code; the 43 unrolled
  layers in one graph compile for longer than a bench call may run), caches marked as static
  addresses as static-cache users do, cudagraph skip reasons collected from inductor.

The context is reached with `start_at` (random cache entries, position = context): the static
step's work depends on max_seq_len and batch, never on the cached values, and prefilling 16k
tokens through the reference path would cost more memory and time than the measurement.
"""

from __future__ import annotations

import logging
import statistics
import time

import torch

from audit.bench.profile import kernel_profile, layer_graph_profile
from audit.bench.result import ModeResult

STATE_TIMING_WARMUP = 3


def timed(step, steps: int) -> list[float]:
    """Per-step milliseconds by CUDA events, each step synchronized before the next."""
    from dsv4.kernels.bench import event_times

    return event_times(step, steps)


def summarize(row: ModeResult, times: list[float]) -> None:
    q = statistics.quantiles(times, n=10) if len(times) >= 10 else [min(times), max(times)]
    row.steps = len(times)
    row.ms_median = statistics.median(times)
    row.ms_p10, row.ms_p90 = q[0], q[-1]
    row.tokens_per_s = row.batch * 1e3 / row.ms_median


def run_mode(model, mode: str, batch: int, context: int, steps: int, verify_steps: int, rng,
             fuse: bool) -> ModeResult:
    from dsv4.decode.graph import CUDAGraphDecoder
    from dsv4.decode.verify import verify_replay

    row = ModeResult(mode, batch, context, fused=fuse and mode in ("ab", "full"))
    V = model.cfg.vocab_size
    ids = torch.randint(0, V, (batch,), generator=rng)
    if mode == "compile":
        return run_compile(model, row, ids, steps, rng)
    t0 = time.perf_counter()
    dec = CUDAGraphDecoder(model, mode=mode, batch_size=batch, fuse=row.fused)
    row.build_s = time.perf_counter() - t0
    if mode != "eager" and verify_steps:
        res = verify_replay(dec, steps=verify_steps, prompt_len=16, seed=int(ids[0]))
        row.bitwise_ok = res.ok
        if not res.ok:
            row.note = res.first_mismatch or "replay differs from eager"
    if row.fused:
        row.drift = fused_drift(dec, ids)
    dec.start_at(context, rng)
    dec.stage(ids)
    summarize(row, timed(dec.step, steps + STATE_TIMING_WARMUP)[STATE_TIMING_WARMUP:])
    return row


def profile_row(model, row: ModeResult, rng) -> None:
    """A full row's kernel table and per-layer graph times, from its decoder built again. The bench
    calls this after every row of the process is timed: once torch.profiler has attached CUPTI, graph
    replays in that process stay slower (flash-h200, ctx 16384: 7.8 ms/token timed first, 8.7 after
    another row's profile)."""
    from dsv4.decode.graph import CUDAGraphDecoder

    try:
        dec = CUDAGraphDecoder(model, mode="full", batch_size=row.batch, fuse=row.fused)
        dec.start_at(row.context, rng)
        dec.stage(torch.randint(0, model.cfg.vocab_size, (row.batch,), generator=rng))
        row.kernels = kernel_profile(dec.step)
        row.per_layer = layer_graph_profile(dec)  # last: its replays rewrite the caches
    except Exception as e:  # noqa: BLE001 - the timing stands without the breakdown
        row.note = "; ".join(filter(None, (row.note, f"profile failed: {type(e).__name__}: {e}")))


@torch.no_grad()
def fused_drift(dec, ids, steps: int = 4) -> float:
    """Max relative logit difference, fused eager step vs the unfused static path, same state each step."""
    from dsv4.decode.static import StaticDecoder

    plain = StaticDecoder(dec.model, dec.static.batch_size)
    fused = dec.static
    fused.prefill(torch.randint(0, dec.model.cfg.vocab_size, (fused.batch_size, 16)))
    state = [fused.pos] + dec.cache_tensors()
    worst = 0.0
    for i in range(steps):
        step_ids = (ids + i) % dec.model.cfg.vocab_size
        snap = [t.clone() for t in state]
        plain.pos.copy_(fused.pos)
        plain.host_pos = fused.host_pos
        plain.stage(step_ids)
        want = plain.step().clone()
        for t, s in zip(state, snap):
            t.copy_(s)
        fused.stage(step_ids)
        got = fused.step()
        worst = max(worst, ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item())
    return worst


class _SkipReasons(logging.Handler):
    """Collects inductor's 'skipping cudagraphs due to ...' warnings, quietly (see `_quiet_skips`)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.reasons: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if "skipping cudagraphs" in msg.lower():
            self.reasons.append(msg.strip())


# Where inductor's warnings end up: its own logger (children propagate to it) carries torch's stderr
# handler. The skip reasons are WARNING records, so no level is lowered (lowering it to DEBUG printed
# ~187,000 lines of inductor debug logs per compile row); torch's handler is set aside while ours
# collects, so nothing is printed, and put back after.
_INDUCTOR_LOGGER = "torch._inductor"


class _quiet_skips:
    def __enter__(self) -> _SkipReasons:
        self.logger = logging.getLogger(_INDUCTOR_LOGGER)
        self.saved = list(self.logger.handlers)
        for h in self.saved:
            self.logger.removeHandler(h)
        self.handler = _SkipReasons()
        self.logger.addHandler(self.handler)
        return self.handler

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)
        for h in self.saved:
            self.logger.addHandler(h)
        return False


@torch.no_grad()
def run_compile(model, row: ModeResult, ids, steps: int, rng) -> ModeResult:
    """torch.compile(mode="reduce-overhead") per layer over the static path."""
    from dsv4.decode.static import StaticDecoder

    dec = StaticDecoder(model, batch_size=row.batch)
    for t in _static_tensors(dec):
        torch._dynamo.mark_static_address(t)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    net = dec.net
    opts = {"mode": "reduce-overhead", "dynamic": False}
    layers = [torch.compile(layer, **opts) for layer in net.layers]
    embed, head = torch.compile(net.embed, **opts), torch.compile(net.head, **opts)
    ids2 = dec.ids[:, None]

    def step():
        torch.compiler.cudagraph_mark_step_begin()
        X = embed(dec.ids)
        for layer in layers:
            X = layer(X, ids2, dec.pos)
        out = head(X)
        dec.pos.add_(1)
        return out

    with _quiet_skips() as handler:
        skips_before = _skip_count()
        try:
            dec.start_at(row.context, rng)
            dec.stage(ids)
            t0 = time.perf_counter()
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            row.build_s = time.perf_counter() - t0
            row.note = f"per-layer compile + warmup {row.build_s:.0f} s"
            summarize(row, timed(step, steps))
        except Exception as e:  # the peer failing is a result too: report it, don't hide it
            row.note = f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    row.skip_reasons = sorted(set(handler.reasons))
    n_skips = _skip_count() - skips_before
    if n_skips and not row.skip_reasons:
        row.skip_reasons = [f"{n_skips} cudagraph skip(s) counted by inductor (no message logged)"]
    return row


def _skip_count() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["inductor"].get(k, 0) for k in ("cudagraph_skips",))


def _static_tensors(dec) -> list[torch.Tensor]:
    """The decoder's inputs and everything its step writes: what reduce-overhead must not copy."""
    return [dec.ids, dec.pos] + dec.model.cache_tensors()
