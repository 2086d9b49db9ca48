"""CUDAGraphDecoder: the static decode step replayed from CUDA graphs, on one or several devices.

Modes:
- `eager`: the static path run op by op (the baseline every graph is checked against).
- `ab`: per layer, graph A (mHC pre, norm, q/kv projections) and graph B (output projections,
  mHC post, the FFN/MoE site), with the cache-touching attention run eagerly in between: the
  split the earlier system stopped at.
- `full`: one graph per device segment holding the whole step, attention, compressors and caches
  included.

Capture happens once, at construction, before any prefill: the caches and the position are
preallocated and written in place by `prefill`, so the graphs' addresses stay valid for every
later sequence. Each device segment captures on a stream created ON that device inside
`torch.cuda.device(dev)` (set_device alone gives empty graphs or stale replays on other devices)
and replays under the same device context. Inputs are staged through pinned host memory and
copies between segments happen between graph launches, never inside one.

`fuse=True` first compiles each layer's step functions with inductor (dsv4/decode/fuse.py), so
the graphs hold a few fused kernels per layer instead of hundreds of small ones; the static path
this decoder is verified against (`self.static.step`) then runs the same fused functions.

Tensor parallel (dsv4/decode/parallel.py, one process and one GPU per rank): build the decoder on
the sharded model. The all-reduces after wo_b and after the MoE sum are issued on the current
stream, so under NCCL they are captured inside the graph like kernels: in `full` mode each rank's
one graph holds all of its layers' collectives, in `ab` mode they sit in graph B. The warmup runs
on the capture stream create the NCCL communicator before capture; every rank must then stage the
same ids and replay the same graphs in the same order (dsv4/decode/tp_run.py broadcasts the token).
"""

from __future__ import annotations

import contextlib

from typing import Callable

import torch

from dsv4.decode.fuse import compile_room, fuse_ends, fuse_layers
from dsv4.decode.placement import current_placement, place
from dsv4.decode.static import StaticDecoder, StaticLayer
from dsv4.errors import DSV4Error
from dsv4.model import Transformer

MODES = ("eager", "ab", "full")


class _Piece:
    """One unit of a segment's step: a captured graph (replayed) or an eager callable."""

    def __init__(self, fn: Callable[[], object] | None = None, graph: torch.cuda.CUDAGraph | None = None):
        self.run = graph.replay if graph is not None else fn


class _Segment:
    """A run of layers on one device with its own copies of ids and position."""

    def __init__(self, dec: "CUDAGraphDecoder", device: torch.device, layers: list[StaticLayer],
                 first: bool, last: bool):
        self.dec, self.device, self.layers, self.first, self.last = dec, device, layers, first, last
        st = dec.static
        same = first and device == st.device  # later segments keep their own copies (they advance them)
        self.ids = st.ids if same else torch.zeros_like(st.ids, device=device)
        self.pos = st.pos if same else torch.zeros_like(st.pos, device=device)
        self.x_in: torch.Tensor | None = None  # static input streams (not for the first segment)
        self.out: torch.Tensor | None = None   # streams, or logits for the last segment
        self.pieces: list[_Piece] = []

    # the eager functions that graphs capture --------------------------------------------
    def streams_in(self) -> torch.Tensor:
        return self.dec.static.net.embed(self.ids) if self.first else self.x_in

    def finish(self, X: torch.Tensor) -> torch.Tensor:
        out = self.dec.static.net.head(X) if self.last else X
        self.pos.add_(1)
        return out

    def forward(self) -> torch.Tensor:
        X = self.streams_in()
        for layer in self.layers:
            X = layer(X, self.ids[:, None], self.pos)
        return self.finish(X)


class CUDAGraphDecoder:
    def __init__(self, model: Transformer, mode: str = "full", batch_size: int = 1, devices=None,
                 warmup: int = 2, capture_error_mode: str = "global", fuse: bool = False):
        if mode not in MODES:
            raise DSV4Error(f"unknown decode mode {mode!r}; choose one of {', '.join(MODES)}")
        if mode != "eager" and not torch.cuda.is_available():
            raise DSV4Error(f"graph mode {mode!r} needs CUDA; use mode 'eager' (or the reference path) on the CPU")
        self.mode, self.warmup, self.capture_error_mode = mode, warmup, capture_error_mode
        placement = place(model, devices) if devices is not None else current_placement(model)
        self.model = model
        self.static = StaticDecoder(model, batch_size)
        layers = list(self.static.net.layers)
        self.fused = fuse
        if fuse:  # the eager reference (self.static.step) runs the same fused functions
            fuse_layers(layers, mode)
            fuse_ends(self.static.net)
        n = len(placement)
        self.segments = [_Segment(self, p.device, [layers[i] for i in p.layers], s == 0, s == n - 1)
                         for s, p in enumerate(placement)]
        self.pools: dict[torch.device, object] = {}
        with torch.no_grad(), (compile_room() if fuse else contextlib.nullcontext()):
            for seg in self.segments:
                self._build(seg)
        # the graphs hold raw pointers into these: kept alive, so a reallocation elsewhere cannot hand their
        # memory to another tensor, and the generation says when the model no longer uses them
        self._captured = (self.model.cache_tensors(), model.cache_generation)

    def _check_caches(self) -> None:
        if self.mode != "eager" and self.model.cache_generation != self._captured[1]:
            raise DSV4Error(f"the model's caches were reallocated after this {self.mode}-graph decoder (batch "
                            f"{self.static.batch_size}) captured them (another decoder, or a prefill at another "
                            "batch size): build this decoder again")

    # ------------------------------------------------------------------ building
    def _build(self, seg: _Segment) -> None:
        if not seg.first:
            prev = self._prev(seg).out
            seg.x_in = torch.zeros(prev.shape, dtype=prev.dtype, device=seg.device)
        if self.mode == "eager":
            seg.pieces = [_Piece(lambda seg=seg: setattr(seg, "out", seg.forward()))]
            seg.out = seg.forward()  # shapes for the next segment's input; prefill resets the state
        elif self.mode == "full":
            graph, seg.out = self._capture(seg.device, seg.forward)
            seg.pieces = [_Piece(graph=graph)]
        else:
            self._build_ab(seg)

    def _build_ab(self, seg: _Segment) -> None:
        pieces = []
        if seg.first:
            g, X = self._capture(seg.device, seg.streams_in)
            pieces.append(_Piece(graph=g))
        else:
            X = seg.x_in
        for layer in seg.layers:
            X_layer = X
            ga, (x, q, kv, qr, post, comb) = self._capture(seg.device, lambda L=layer, Xl=X_layer: L.part_a(Xl, seg.pos))
            o_buf = torch.zeros_like(layer.part_attn(x, q, kv, qr, seg.pos))

            def attend(L=layer, a=(x, q, kv, qr), o=o_buf):
                o.copy_(L.part_attn(*a, seg.pos))

            gb, X = self._capture(seg.device, lambda L=layer, Xl=X_layer, o=o_buf, p=post, c=comb:
                                  L.part_b(o, Xl, p, c, seg.ids[:, None], seg.pos))
            pieces += [_Piece(graph=ga), _Piece(attend), _Piece(graph=gb)]
        gf, seg.out = self._capture(seg.device, lambda Xf=X: seg.finish(Xf))
        pieces.append(_Piece(graph=gf))
        seg.pieces = pieces

    def _capture(self, device: torch.device, fn: Callable[[], object]):
        """Warm up on a side stream of `device`, then capture fn into a graph sharing the device's pool."""
        with torch.cuda.device(device):
            pool = self.pools.setdefault(device, torch.cuda.graph_pool_handle())
            stream = torch.cuda.Stream(device=device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(self.warmup):
                    fn()
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode=self.capture_error_mode):
                out = fn()
            torch.cuda.current_stream(device).wait_stream(stream)
        return graph, out

    def _prev(self, seg: _Segment) -> _Segment:
        return self.segments[self.segments.index(seg) - 1]

    # ------------------------------------------------------------------ running
    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        self._check_caches()
        logits = self.static.prefill(tokens)
        for seg in self.segments:
            if seg.pos is not self.static.pos:
                seg.pos.copy_(self.static.pos)
        return logits

    def start_at(self, position: int, generator: torch.Generator | None = None) -> None:
        """StaticDecoder.start_at for every segment (benchmarks at long contexts)."""
        self._check_caches()
        self.static.start_at(position, generator)
        for seg in self.segments:
            if seg.pos is not self.static.pos:
                seg.pos.copy_(self.static.pos)

    def stage(self, ids) -> None:
        """Host side of a step (outside every graph): pinned staging, then per-device copies."""
        self.static.stage(ids)
        for seg in self.segments:
            if seg.ids is not self.static.ids:
                seg.ids.copy_(self.static.ids, non_blocking=True)

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        """Replays the step; returns the logits buffer (the same tensor every step: clone to keep)."""
        self._check_caches()
        for seg in self.segments:
            if seg.x_in is not None:
                seg.x_in.copy_(self._prev(seg).out, non_blocking=True)
            if seg.device.type == "cuda":
                with torch.cuda.device(seg.device):
                    for piece in seg.pieces:
                        piece.run()
            else:
                for piece in seg.pieces:
                    piece.run()
        return self.segments[-1].out

    def decode(self, ids) -> torch.Tensor:
        self.stage(ids)
        return self.step()

    def state_tensors(self) -> list[torch.Tensor]:
        """Everything a step mutates: the position(s), caches and compressor states."""
        return [self.static.pos] + [s.pos for s in self.segments if s.pos is not self.static.pos] + \
            self.cache_tensors()

    def cache_tensors(self) -> list[torch.Tensor]:
        return self.model.cache_tensors()
