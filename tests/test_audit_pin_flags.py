"""A staging buffer pinned where the platform allows it (audit/scan/standins/pin_flags.py).

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


OWN = """
import torch


class Runner:
    def __init__(self, device):
{flag}
        self.ids_cpu = torch.zeros({n}, dtype=torch.long, pin_memory={arg})
        self.ids = torch.zeros({n}, dtype=torch.long, device=device)
        self.table = torch.randn({v}, {d}, device=device)
        self.out = torch.zeros({n}, {d}, device=device)
        self.mode = "{mode}"

    def prepare(self, i):
        self.ids_cpu.copy_(torch.randint(0, {v}, ({n},)))

    @torch.no_grad()
    def step(self):
        self.ids.copy_(self.ids_cpu, non_blocking=True)  # SITE
        self.out.copy_(self.table[self.ids] * 2.0)
        return self.out


def make(device):
    return Runner(device)
"""

DEVICE_FLAGS = {
    "device-type local": ("        on_gpu = torch.device(device).type == \"cuda\"", "on_gpu", "clean"),
    "device string attribute": ("        self.pin = device != \"cpu\"", "self.pin", "clean"),
    "tensor flag": ("        probe = torch.zeros(1, device=device)", "probe.is_cuda", "clean"),
    "mode string": ("        self.mode = \"{mode}\"", "self.mode == \"pinned\"", "hit"),
    "constant": ("        pin = False", "pin", "hit"),
}


@pytest.mark.parametrize("kind", sorted(DEVICE_FLAGS))
def test_a_device_test_flag_pins_as_a_gpu_would(tmp_path, kind):
    """`pin_memory=on_gpu` with `on_gpu = torch.device(device).type == "cuda"`: False on a CPU scan only because
    the scan runs on the CPU; a GPU pins the buffer and the non_blocking upload is a captured memcpy. A flag on
    anything else (a mode string, a constant) stays the code's choice."""
    from site_util import at, write_target

    flag, arg, want = DEVICE_FLAGS[kind]
    mode = random.choice(["eager", "compat", "pageable"])
    path, site = write_target(tmp_path / f"pin_{random.randrange(10**6)}.py", OWN, flag=flag.format(mode=mode),
                              arg=arg, n=random.randint(2, 7), v=random.randint(9, 40), d=random.randint(3, 12),
                              mode=mode)
    bad = blocking(path)
    if want == "clean":
        assert not len(bad), bad.to_string()
    else:
        assert len(at(bad, "pageable-copy", site)) == 1, bad.to_string()
