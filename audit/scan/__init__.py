"""Stage 1: run the target's steps once under one tracer and keep what a graph would see.

`run.scan` drives warmup and audited steps, `tracer` records every op with its arguments, tensors
and user frame, `hooks` patches host reads and waits for the audited step only, `state`
snapshots Python state around it, `user_code` tells the target's frames from library frames.
"""

from audit.scan.run import scan
from audit.scan.records import OpRecord, TensorMeta, Trace
from audit.scan.tracer import Tracer

__all__ = ["OpRecord", "TensorMeta", "Trace", "Tracer", "scan"]
