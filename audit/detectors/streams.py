"""unjoined-stream: side-stream work that the step's stream does not fork into or join back.

Under capture only streams that wait on the capturing stream (fork) are part of the graph: work
issued on another stream runs once, eagerly, while capturing, and replay skips it without a word
(measured on an H200: a toy decoder's graph held 5 kernel nodes against 7 eager kernels). Work
forked but never waited on by the step's stream (join) fails the capture (unjoined), and in eager
decode the step's stream reads it before it is written. The legal pattern is
`s.wait_stream(cur)` before the block and `cur.wait_stream(s)` after it, or events both ways.

The trace holds the stream events of audit.scan.patches.stream_hooks between the ops; we replay them with
a vector clock per stream (what each stream has waited for) and check every op:
- an op on a side stream that has not (transitively) waited on the step's stream: fork missing;
- an op reading a tensor another stream wrote after the last wait on it: join missing (or a fork
  that came too early, when the writer is the step's stream);
- a side stream with work the step's stream never waited for by the end of the step: join missing;
- a wait, on the step's stream or one forked from it, for an event recorded outside the step or on a stream
  that was not forked (`cur.wait_stream(self.copy_stream)` for a copy prepare() issued): a capturing stream
  cannot wait on an event its capture did not record, so capture fails (cudaErrorStreamCaptureIsolation).
One finding per stream block (the line that switched to the stream) and kind; the message names
the block's first op.
"""

from __future__ import annotations

from audit.detectors import register
from audit.detectors.source import lookup
from audit.scan.patches.stream_hooks import KIND, parse


OUTSIDE = ("waits on an event recorded outside the step or on a stream the step never forked (work issued in "
           "prepare() or a previous step): a capturing stream cannot wait on an event its capture did not record, so "
           "capture fails (cudaErrorStreamCaptureIsolation), and a replay would not wait for that work anyway")
OUTSIDE_FIX = ("wait for prepare()'s work in prepare() (`torch.cuda.current_stream().wait_stream(s)` there, before the "
               "step runs) or issue it on the stream the step runs on; inside the step wait only on events recorded "
               "in the step, on streams forked from the step's stream")


class _Step:
    """Replays one step's stream events; collects (kind, block record, first op, detail)."""

    def __init__(self, main: str):
        self.main, self.cur = main, main
        self.clock: dict[str, dict[str, int]] = {main: {main: -1}}  # stream -> {stream: last op index waited for}
        self.events: dict[str, dict[str, int]] = {}
        self.captured: dict[str, bool] = {}                       # event id -> recorded in the step's capture
        self.writer: dict[int, tuple[str, int, object]] = {}      # tensor id -> (stream, op index, block)
        self.block: dict[str, object] = {}                        # stream -> the record that switched to it
        self.first: dict[int, object] = {}                        # id(block) -> first op in it
        self.last: dict[str, int] = {}
        self.entering: str | None = None
        self.hits: dict[tuple, tuple] = {}

    def stream_event(self, r) -> None:
        op, ids = parse(r)
        if op == "stream.enter":  # `with torch.cuda.stream(s)`: its line starts the block, its switch follows
            self.block[ids[0]], self.entering = r, ids[0]
        elif op == "stream.set":
            if self.entering != ids[0]:
                self.block[ids[0]] = r
            self.cur, self.entering = ids[0], None
        elif op == "event.record":
            self.events[ids[0]] = dict(self._clock(ids[1]))
            # a stream that ran ops in the step unforked has its own finding (fork missing) at its block
            self.captured[ids[0]] = self._forked(ids[1]) or ids[1] in self.last
        elif op == "event.wait":
            if self._forked(ids[1]) and not self.captured.get(ids[0], False):
                self._hit("outside", r, r, OUTSIDE)
            mine = self._clock(ids[1])
            for s, k in self.events.get(ids[0], {}).items():
                mine[s] = max(mine.get(s, -1), k)

    def _clock(self, sid: str) -> dict:
        return self.clock.setdefault(sid, {})

    def _forked(self, sid: str) -> bool:
        """Part of the capture: the step's stream, or one that waited on it (transitively) in this step."""
        return sid == self.main or self.main in self._clock(sid)

    def op(self, r) -> None:
        s, clock = self.cur, self._clock(self.cur)
        block = self.block.get(s) if s != self.main else None
        if block is not None:
            self.first.setdefault(id(block), r)
        forked = self._forked(s)
        if not forked:
            self._hit("fork", block or r, r, "runs with no wait on the step's stream before it: under capture it "
                                              "is not part of the graph and replay skips it")
        for m, inner in zip(r.inputs, r.in_step):
            w = self.writer.get(m.tid) if inner else None
            if w is None or w[0] == s or clock.get(w[0], -1) >= w[1] or not forked:
                continue
            if w[0] == self.main:
                self._hit("fork", block or r, r, f"reads a tensor the step's stream wrote (`{r.op}`) after the fork: "
                                                 "the side stream can read it before it is written")
            else:
                self._hit("join", w[2], self.first.get(id(w[2]), r),
                          f"is read (`{r.op}`) before the reading stream waited for it: a race in eager decode, "
                          "a missing dependency in the graph")
        clock[s] = r.index
        self.last[s] = r.index
        for m in r.outputs:
            self.writer[m.tid] = (s, r.index, block or r)
        if r.op.endswith("_") and r.inputs:  # in-place: the first input is written
            self.writer[r.inputs[0].tid] = (s, r.index, block or r)

    def end(self) -> None:
        done = self.clock[self.main]
        for s, k in self.last.items():
            if s != self.main and done.get(s, -1) < k and self.main in self._clock(s):
                block = self.block.get(s)
                self._hit("join", block, self.first.get(id(block)), "is never waited on by the step's stream: "
                                                                     "capture fails (unjoined work), eager reads race")

    def _hit(self, kind: str, block, first, why: str) -> None:
        if block is None:
            return
        self.hits.setdefault((kind, id(block)), (kind, block, first or block, why))


def _sent(r) -> bool:
    """`x.to(self.device, non_blocking=True)` on a CPU scan: a no-op here (no aten op), a copy kernel on the current
    stream on a GPU (an apex-style prefetcher's upload inside `with torch.cuda.stream(s):`)."""
    return r.kind == "host" and r.note == "cpu?" and not r.nested and bool(r.inputs) and bool(r.stack) \
        and not lookup.names_cpu(r.stack[-1][0].co_filename, r.stack[-1][1])


def _replay(recs: list) -> list:
    start = next((r for r in recs if r.kind == KIND and r.op == "stream.start"), None)
    if start is None:  # no stream information (a CPU scan on a machine that has CUDA)
        return []
    st = _Step(start.note)
    for r in recs:
        if r.kind == KIND and r.op != "stream.start":
            st.stream_event(r)
        elif r.kind == "aten" and not r.nested:
            st.op(r)
        elif _sent(r):
            st.op(r)
            st.writer[r.inputs[0].tid] = (st.cur, r.index, st.block.get(st.cur) or r)  # its device copy
    st.end()
    return list(st.hits.values())


@register("unjoined-stream")
def unjoined_streams(ctx):
    """Side-stream blocks without a fork (wait on the step's stream before) or a join (wait after)."""
    groups: dict = {}
    for s in range(len(ctx.steps)):
        for kind, block, first, why in _replay(ctx.steps[s]):
            if not block.frame:
                continue
            groups.setdefault(block.frame[:2] + (kind,), []).append((block, first, why))
    out = []
    for (_, _, kind), g in groups.items():
        block, first, why = g[0]
        if kind == "outside":
            out.append(ctx.finding("unjoined-stream", block, "stream wait", len(g) / ctx.n_steps, why,
                                   severity="blocks-capture", fix=OUTSIDE_FIX))
            continue
        file, line, _ = ctx.where(first)
        msg = (f"side-stream work (first op `{first.op}` at {file}:{line}) {why}" if first is not block
               else f"side-stream op `{first.op}` {why}")
        out.append(ctx.finding("unjoined-stream", block, f"stream {kind}", len(g) / ctx.n_steps, msg,
                               module=first.module))
    return out
