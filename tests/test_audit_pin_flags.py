"""A staging buffer pinned where the platform allows it (audit/scan/pin_flags.py).

vLLM keeps `self.pin_memory = is_pin_memory_available()` and passes it down to `CpuGpuBuffer`, whose host
half is `torch.zeros(..., pin_memory=pin_memory)`; uploading it in the step is a captured memcpy on a GPU. On
a CPU-only torch the probe answers False, which made the CPU scan call the upload a pageable-copy. A flag a
probe computed (through a parameter, an attribute, a local or a default) counts as pinned; a flag that is a
constant False, at the factory or passed down, is the code's choice and the upload stays a pageable-copy.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch


def is_pin_memory_available():
    return torch.cuda.is_available()


class CpuGpuBuffer:
    def __init__(self, n, device, pin_memory):
        self.cpu = torch.zeros(n, dtype=torch.long, device="cpu", pin_memory=pin_memory)
        self.gpu = torch.zeros(n, dtype=torch.long, device=device)

    def copy_to_gpu(self):
        self.gpu.copy_(self.cpu, non_blocking=True)  # LIBSITE
        return self.gpu


class ViaAttribute:
    def __init__(self, n, device):
        self.pin_memory = is_pin_memory_available()
        self.buf = CpuGpuBuffer(n, device, pin_memory=self.pin_memory)


class ViaLocal:
    def __init__(self, n, device):
        pin = is_pin_memory_available() and n > 0
        self.buf = CpuGpuBuffer(n, device, pin)


class ViaDefault:
    def __init__(self, n, device, pin_memory=is_pin_memory_available()):
        self.buf = CpuGpuBuffer(n, device, pin_memory=pin_memory)


class Chosen:
    def __init__(self, n, device, pin_memory=False):
        self.buf = CpuGpuBuffer(n, device, pin_memory=pin_memory)
"""

KINDS = {"attribute": ("ViaAttribute({{d}}, self.x.device)", "clean"), "local": ("ViaLocal({{d}}, self.x.device)", "clean"),
         "default": ("ViaDefault({{d}}, self.x.device)", "clean"), "chosen": ("Chosen({{d}}, self.x.device)", "hit"),
         "passed-false": ("Chosen({{d}}, self.x.device, pin_memory=False)", "hit")}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_flag_a_platform_probe_answered_is_pinned(tmp_path, monkeypatch, kind):
    make, want = KINDS[kind]
    mod, lib, path, site = library_target(
        tmp_path, monkeypatch, LIB, "pinflags", "ViaAttribute, ViaLocal, ViaDefault, Chosen",
        "self.h.buf.copy_to_gpu().float() * self.x", init=f"        self.h = {make.format()}",
        prepare="        self.h.buf.cpu.copy_(torch.randint(0, 9, self.h.buf.cpu.shape))")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, want, "pageable-copy", lib, path, site)


def test_the_probe_answer_is_read_not_assumed(tmp_path, monkeypatch):
    """The same class given a literal False by the target, with the probe in the library untouched."""
    mod, lib, path, site = library_target(
        tmp_path, monkeypatch, LIB, "pinflags", "CpuGpuBuffer", "self.b.copy_to_gpu().float() * self.x",
        init=f"        self.b = CpuGpuBuffer({{d}}, self.x.device, {random.choice(['False', 'None'])})",
        prepare="        self.b.cpu.copy_(torch.randint(0, 9, self.b.cpu.shape))")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "hit", "pageable-copy", lib, path, site)
