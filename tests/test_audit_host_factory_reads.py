"""Tensors a torch factory makes on the host in the step, read back or sent to the device.

M-RoPE prefill positions are built from image grid sizes with `torch.arange(t)`, `torch.arange(h)`, ...
naming no device: host memory on a GPU too. Reading their maximum back (`int(chunk.max())`, the next
chunk's offset) waits for nothing, so it is no host-sync; the same read of aranges made on the device is one.
Stacking several such aranges and sending the result with `.to(x.device)` is a copy from pageable memory
(capture raises), though no single factory's result alone reaches the `.to()`: the stack needs them all.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch


def positions(x, grids, text_len):
    chunks, st = [], 0
    for t, h, w in grids:
        tt = torch.arange(t{dev}).view(-1, 1).expand(-1, h * w).flatten()
        hh = torch.arange(h{dev}).view(1, -1, 1).expand(t, -1, w).flatten()
        ww = torch.arange(w{dev}).view(1, 1, -1).expand(t, h, -1).flatten()
        chunks.append(torch.stack([tt, hh, ww]) + st)
        st = int(chunks[-1].max()) + 1  # {readsite}
    pos = torch.cat(chunks + [torch.arange(text_len{dev}).view(1, -1).expand(3, -1) + st], 1)
    last = pos[:, -1:]{send}  # {sendsite}
    return x * (1.0 + 0.001 * last.sum())
"""


@pytest.mark.parametrize("kind", ["host_read", "host_sent", "device_read"])
def test_host_factory_data(tmp_path, monkeypatch, kind):
    dev = ", device=x.device" if kind == "device_read" else ""
    send = ".to(x.device)" if kind == "host_sent" else ""
    src = LIB.format(dev=dev, send=send, readsite="LIBSITE" if kind == "device_read" else "read",
                     sendsite="LIBSITE" if kind == "host_sent" else "send")
    grids = [(1, random.randint(1, 3), random.randint(1, 3)) for _ in range(random.randint(1, 3))]
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "mrope", "positions",
                                          f"positions(self.x @ self.w, {grids}, {random.randint(1, 4)})")
    bad = blocking(path, forget=mod)
    if kind == "host_read":
        clean_or_hit(bad, "clean", "", lib, path, site)
    elif kind == "host_sent":
        clean_or_hit(bad, "hit", "pageable-copy", lib, path, site)
    else:
        hit = bad[bad.category == "host-sync"]
        assert len(hit) and set(hit.line) == {next(n for n, t in enumerate(lib.read_text().splitlines(), 1)
                                                   if "LIBSITE" in t)}, hit.to_string()
