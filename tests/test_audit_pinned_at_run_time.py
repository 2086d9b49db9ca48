"""Pinned host memory as serving libraries use it, on a CPU-only torch (audit/scan/standins/pinned.py).

- Pinned in the step: vLLM's `async_tensor_h2d` builds each step's metadata with
  `torch.tensor(data, pin_memory=True, device="cpu")` and uploads it with `.to(device, non_blocking=True)`;
  others call `.pin_memory()` on a fresh host tensor. A CPU-only torch raised there, which stopped the scan.
  On a GPU the copy is captured reading a buffer filled once, from the Python data of the captured step: a
  pageable-copy at the uploading line, with the target's call as caller.
- Pinned by a flag: `torch.zeros(n, pin_memory=self.pin)` is pinned when the flag is true, whatever the
  source spells; uploading it in the step is no pageable-copy then, and is one when the flag is false.
- An async output buffer: the sampled ids copied into a pinned host buffer with non_blocking=True are a
  captured memcpy node (no host read); a blocking copy into it waits for the device (host-sync).
"""

from __future__ import annotations


import pytest

from site_util import blocking, clean_or_hit, library_hit, library_target

LIB = """
import torch


def h2d(data, device, pin):
    t = torch.tensor(data, dtype=torch.long, pin_memory=pin, device="cpu")
    return t.to(device=device, non_blocking=True)  # LIB_h2d


def pin_then_copy(data, buf):
    staging = torch.tensor(data, dtype=torch.long).pin_memory()
    buf.copy_(staging, non_blocking=True)  # LIB_pin_then_copy
    return buf


class Staging:
    def __init__(self, n, pin, device):
        self.host = torch.zeros(n, dtype=torch.long, pin_memory=pin)
        self.dev = torch.zeros(n, dtype=torch.long, device=device)

    def stage(self, vals):
        self.host.copy_(torch.tensor(vals))

    def upload(self):
        self.dev.copy_(self.host, non_blocking=True)  # LIB_upload
        return self.dev


class Output:
    def __init__(self, n, pin):
        self.cpu = torch.empty(n, dtype=torch.long, pin_memory=pin)

    def push(self, tok, wait):
        self.cpu.copy_(tok, non_blocking=not wait)  # LIB_push
        return self.cpu


class OutputPinned:
    def __init__(self, n):
        self.cpu = torch.empty(n, dtype=torch.long, pin_memory=True)

    def push(self, tok, wait):
        self.cpu.copy_(tok, non_blocking=not wait)  # LIB_push_pinned
        return self.cpu
"""


VALS = "[random.randrange({d}) for _ in range({d})]"  # {d}: library_target's size, filled in by it


@pytest.mark.parametrize("form", ["h2d", "pin_then_copy"])
def test_host_data_pinned_in_the_step_is_a_pageable_copy_at_the_upload(tmp_path, monkeypatch, form):
    """Before audit/scan/standins/pinned.py the CPU scan stopped at the pinning line (a CPU-only torch raises)."""
    call = {"h2d": "h2d(self.vals, 'cpu', True).float() * self.x", "pin_then_copy":
            "pin_then_copy(self.vals, self.ibuf).float() * self.x"}[form]
    mod, lib, path, site = library_target(
        tmp_path, monkeypatch, LIB, "pinstep", "h2d, pin_then_copy", call,
        init="        self.vals = [0]\n        self.ibuf = torch.zeros(1, dtype=torch.long)",
        prepare="        import random\n        self.vals = [random.randrange(7)]")
    bad = blocking(path, forget=mod)
    hit = library_hit(bad, "pageable-copy", lib, path, site, marker=f"# LIB_{form}")
    assert hit.iloc[0].severity == "silent-corruption" and "pinned in the step" in hit.iloc[0].message


@pytest.mark.parametrize("pin", [True, False])
def test_a_buffer_pinned_by_a_flag_is_pinned_when_the_flag_is_true(tmp_path, monkeypatch, pin):
    mod, lib, path, site = library_target(
        tmp_path, monkeypatch, LIB, "pinflag", "Staging", "self.st.upload().float() * self.x",
        init=f"        self.st = Staging({{d}}, {pin}, self.x.device)",
        prepare=f"        import random\n        self.st.stage({VALS})")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "clean" if pin else "hit", "pageable-copy", lib, path, site, marker="# LIB_upload")


@pytest.mark.parametrize("literal", [True, False])
@pytest.mark.parametrize("wait", [False, True])
def test_sampled_ids_into_a_pinned_output_buffer(tmp_path, monkeypatch, literal, wait):
    """non_blocking into pinned memory: a memcpy node (clean); blocking: the host waits (host-sync). The buffer
    is pinned by `pin_memory=True` in its source, or by a flag the target passes (the run decides)."""
    make, marker = ("OutputPinned({d})", "# LIB_push_pinned") if literal else ("Output({d}, bool(len('x')))", "# LIB_push")
    mod, lib, path, site = library_target(
        tmp_path, monkeypatch, LIB, "pinout", "Output, OutputPinned",
        f"self.o.push((self.x * 3).long()[0], {wait}).float() + self.x", init=f"        self.o = {make}")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "hit" if wait else "clean", "host-sync", lib, path, site, marker=marker)
