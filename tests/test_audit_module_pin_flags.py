"""A pin flag kept as a module global (audit/scan/standins/pin_flags.py).

Serving code decides once, at import, whether it can pin: `PIN = torch.cuda.is_available()`, then
`torch.zeros(n, pin_memory=PIN)` for its staging buffers. On a CPU-only torch the probe answers False, so the
scan made the buffer pageable and called its non_blocking upload a pageable-copy; a GPU pins it and captures
a memcpy. The global is followed to its module-level assignment like a local; a constant False stays the code's
choice.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, write_target

OWN = """
import torch

{flag}


class Runner:
    def __init__(self, device):
        self.ids_cpu = torch.zeros({n}, dtype=torch.long, pin_memory={arg})
        self.ids = torch.zeros({n}, dtype=torch.long, device=device)
        self.table = torch.randn({v}, {d}, device=device)
        self.out = torch.zeros({n}, {d}, device=device)

    def prepare(self, i):
        self.ids_cpu.copy_(torch.randint(0, {v}, ({n},)))

    @torch.no_grad()
    def step(self):
        self.ids.copy_(self.ids_cpu.to(self.ids.device, non_blocking=True))  # SITE
        self.out.copy_(self.table[self.ids] * 2.0)
        return self.out


def make(device):
    return Runner(device)
"""

FLAGS = {
    "probe": ("{name} = torch.cuda.is_available()", "clean"),
    "probe anded": ("{name} = torch.cuda.is_available() and {n} > 0", "clean"),
    "constant": ("{name} = False", "hit"),
    "constant device test": ("DEV = \"cpu\"\n{name} = DEV != \"cpu\"", "hit"),
}


@pytest.mark.parametrize("kind", sorted(FLAGS))
def test_a_module_global_pin_flag_is_followed_to_its_assignment(tmp_path, kind):
    flag, want = FLAGS[kind]
    name = random.choice(["PIN", "_PIN_MEMORY", "use_pinned"])
    n = random.randint(2, 7)
    path, site = write_target(tmp_path / f"modpin_{random.randrange(10**6)}.py", OWN, flag=flag.format(name=name, n=n),
                              arg=name, n=n, v=random.randint(9, 40), d=random.randint(3, 12))
    bad = blocking(path)
    if want == "clean":
        assert not len(bad), bad.to_string()
    else:
        assert len(at(bad, "pageable-copy", site)) == 1, bad.to_string()
