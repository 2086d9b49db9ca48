"""Which stream each op of a CUDA step ran on, and which waits ordered the streams.

Ops carry no stream: the stream current at an op is the last switch before it in the step's
record sequence, so switches and waits are recorded as 'stream' events between the ops
(audit.detectors.streams replays them). Every cross-stream wait in torch goes through
Event.record / Event.wait (Stream.wait_stream, wait_event and record_event are built on them);
every switch through torch.cuda.set_stream (which `with torch.cuda.stream(s)` calls). The
block's own line comes from StreamContext.__enter__. CPU stand-ins (audit.scan.standins.cpu_cuda) record
the same events, in the same format.

Events (op, note): stream.start <sid> | stream.enter <sid> | stream.set <sid> |
event.record <eid> <sid> | event.wait <eid> <sid>;  sid = "<device index>:<stream id>".
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["KIND", "key", "note", "parse", "start", "watching"]

KIND = "stream"


def key(stream) -> str:
    return f"{getattr(stream, 'device_index', 0)}:{stream.stream_id}"


def note(tracer, op: str, *ids: str) -> None:
    tracer.record_event(KIND, op, note=" ".join(ids), depth=3)


def start(tracer, sid: str) -> None:
    """The step's own stream, noted as the step begins (no user frame: nothing of the step ran yet)."""
    if tracer._step >= 0:
        tracer.record_event(KIND, "stream.start", note=sid, depth=None)


def parse(rec) -> tuple[str, list[str]]:
    """(op, ids) of a stream event."""
    return rec.op, rec.note.split()


@contextlib.contextmanager
def watching(tracer, patched):
    """CUDA scans: records the step's stream, then every switch, block entry, event record and wait."""
    cuda = torch.cuda
    rec0, wait0, set0, enter0 = cuda.Event.record, cuda.Event.wait, cuda.set_stream, cuda.StreamContext.__enter__

    def record(self, stream=None):
        stream = stream if stream is not None else cuda.current_stream()
        rec0(self, stream)
        note(tracer, "event.record", str(id(self)), key(stream))

    def wait(self, stream=None):
        stream = stream if stream is not None else cuda.current_stream()
        wait0(self, stream)
        note(tracer, "event.wait", str(id(self)), key(stream))

    def set_stream(stream):
        set0(stream)
        if stream is not None:
            note(tracer, "stream.set", key(stream))

    def enter(self):
        if self.stream is not None:
            note(tracer, "stream.enter", key(self.stream))
        return enter0(self)

    # The step runs on a stream of its own, forked from and joined back to the caller's outside the record, as
    # a capture runs on a side stream: the default stream is then another stream than the step's, and a stream
    # a step looked up once and kept (`if self.main is None: self.main = torch.cuda.current_stream()`) is not
    # the stream a later step runs on. The CPU stand-ins (audit.scan.standins.cpu_cuda, which a CUDA tracer on a torch
    # without CUDA runs under) give each step its own stream already.
    real = cuda.is_available()
    outer = cuda.current_stream(tracer.device) if real else None
    own = cuda.Stream(device=outer.device) if real else None
    if real:
        own.wait_stream(outer)
    try:
        with cuda.stream(own) if real else contextlib.nullcontext(), contextlib.ExitStack() as stack:
            stack.enter_context(patched(cuda.Event, "record", record))
            stack.enter_context(patched(cuda.Event, "wait", wait))
            stack.enter_context(patched(cuda, "set_stream", set_stream))
            stack.enter_context(patched(cuda.StreamContext, "__enter__", enter))
            start(tracer, key(own if real else cuda.current_stream(tracer.device)))
            yield
    finally:
        if real:
            outer.wait_stream(own)
