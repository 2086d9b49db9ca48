"""The bytes of the target's pinned staging buffers, hashed around each audited step.

A pinned host buffer exists to be refilled outside the graph and uploaded inside it. A step that refills it
through a numpy view (`self.cpu.numpy()[:n] = lens`, `np.copyto(buf.numpy(), a)`) writes host memory with no
torch op: the dispatch trace shows nothing, and a replay would upload the bytes of the captured step. The
buffers are those asked to be pinned (audit.scan.standins.pinned; `is_pinned()` on a CUDA build), up to 64K elements,
under the owner "<pinned bytes>"; audit/detectors/staging_refill.py finds the writing statement.
"""

from __future__ import annotations

import torch

from audit.scan.snapshot.own_dict import own_dict
from audit.scan.standins import pinned

__all__ = ["OWNER", "snapshot"]

OWNER = "<pinned bytes>"


def snapshot(objects) -> dict:
    out = {}
    for path, obj in objects:
        for k, v in list(own_dict(obj).items()):
            if not (isinstance(v, torch.Tensor) and v.device.type == "cpu" and 0 < v.numel() <= 1 << 16):
                continue
            try:
                if pinned.asked(v) or v.is_pinned():
                    out[(OWNER, f"{path}.{k}" if path else k)] = hash(
                        bytes(v.detach().contiguous().view(torch.uint8).numpy()))
            except (RuntimeError, TypeError):  # a subclass or layout without plain bytes
                continue
    return out
