"""host-sync on a CPU scan: conversions towards the CPU that the call's arguments name indirectly.

`counts.to(**HOST_KW)` with `HOST_KW = {"device": "cpu", ...}` (a dict of factory kwargs kept by the library) and
`counts.type(torch.LongTensor)` / `.type("torch.FloatTensor")` (legacy CPU tensor types) are device->host copies
on a GPU, as `.cpu()` is. `.to(**{"dtype": ...})`, `.type(torch.long)`, and any of these on host data built in
the step read nothing."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch

HOST_KW = {kw}


def to_host(h, n):
    counts = torch.histc((h.abs() * 1000).long().remainder(n).float(), bins=n, min=0, max=n - 1)
    src = {src}
    host = {conv}  # LIBSITE
    return h * {scale}
"""

HITS = [("{'device': 'cpu', 'dtype': torch.long}", "src.to(**HOST_KW)"),
        ("{'device': torch.device('cpu')}", "src.to(**HOST_KW)"),
        ("{}", "src.type(torch.LongTensor)"), ("{}", "src.type('torch.FloatTensor')"),
        ("{}", "src.type(torch.DoubleTensor, non_blocking=False)")]
CLEAN = [("{'dtype': torch.long}", "src.to(**HOST_KW)"), ("{}", "src.type(torch.long)"),
         ("{}", "src.type(torch.float64)")]


@pytest.mark.parametrize("kind", ["hit", "clean", "host-data"])
def test_conversion_to_a_cpu_type_or_splatted_cpu_device(tmp_path, monkeypatch, kind):
    kw, conv = random.choice(CLEAN if kind == "clean" else HITS)
    src = "torch.tensor([1.0, 2.0, 3.0])" if kind == "host-data" else "counts"
    lib_src = (LIB.replace("{kw}", kw).replace("{conv}", conv).replace("{src}", src)
               .replace("{scale}", str(random.uniform(0.5, 2.0))))
    mod, lib, path, site = library_target(tmp_path, monkeypatch, lib_src, "conv", "to_host",
                                          f"to_host(self.x @ self.w, {random.choice([3, 4, 5])})")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "hit" if kind == "hit" else "clean", "host-sync", lib, path, site)
