"""Weights a library sends to host memory while the target is built (`{n: p.to("cpu") ...}` in a function, as
accelerate's cpu_offload does) and moves back to the execution device in a forward pre-hook at every step: a copy
from pageable memory on a GPU, reported once, at the library's `.to(device)`, with the target's call as caller.
A CPU-only torch returns the same tensor from `.to("cpu")`; the scan makes it new memory, as a GPU would.
The twin sends nothing to the host (`p.to(device)`, the execution device): clean."""

from __future__ import annotations

import random
import textwrap

import audit

LIB = textwrap.dedent("""
    import torch
    from torch import nn


    class Offload:
        def __init__(self, weights, device):
            self.weights = weights
            self.device = device

        def pre_forward(self, module, args):
            for name, w in self.weights.items():
                moved = w.to(self.device)  # MOVE
                module._parameters[name] = nn.Parameter(moved, requires_grad=False).to(self.device)


    def offload(module, device):
        weights = {n: p.detach().to(WHERE) for n, p in module.named_parameters()}
        hook = Offload(weights, device)
        module._offload = hook
        module.register_forward_pre_hook(hook.pre_forward)
        return module
    """)

TARGET = textwrap.dedent("""
    import torch
    from torch import nn
    from {lib} import offload


    class Step:
        def __init__(self, device):
            self.net = offload(nn.Linear({d}, {n}), torch.device(device))
            self.x = torch.randn(2, {d}, device=device)
            self.out = torch.zeros(2, {n}, device=device)

        def prepare(self, i):
            self.x.normal_()

        @torch.no_grad()
        def step(self):
            self.out.copy_(self.net(self.x))  # CALL
            return self.out


    def make(device):
        return Step(device)
    """)


def _write(tmp_path, host: bool):
    (tmp_path / "site").mkdir()
    lib = LIB.replace("WHERE", '"cpu"' if host else "device")
    name = f"offloadlib_{random.randrange(10**9)}"  # a module of its own: sys.modules keeps the other test's
    (tmp_path / "site" / f"{name}.py").write_text(lib)
    (tmp_path / "t").mkdir()
    src = TARGET.format(d=random.randint(4, 32), n=random.randint(4, 32), lib=name)
    (tmp_path / "t" / "offload_target.py").write_text(src)
    line = lambda text, tag: next(i for i, t in enumerate(text.splitlines(), 1) if t.endswith(f"# {tag}"))
    return tmp_path / "t" / "offload_target.py", line(lib, "MOVE"), line(src, "CALL")


def test_weights_sent_to_the_host_at_build_and_moved_back_each_step(tmp_path, monkeypatch):
    path, move, call = _write(tmp_path, host=True)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    inv = audit.scan(f"{path}:make", device="cpu", steps=3)
    bad = inv.blocking()
    assert list(zip(bad.category, bad.line.astype(int), bad.caller_line.astype(int))) == [("pageable-copy", move, call)], \
        bad[["category", "file", "line", "message"]].to_string()
    assert "offloadlib_" in str(bad.file.iloc[0]) and "weights['weight']" in bad.message.iloc[0]


def test_weights_kept_on_the_execution_device_are_clean(tmp_path, monkeypatch):
    path, _, _ = _write(tmp_path, host=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    inv = audit.scan(f"{path}:make", device="cpu", steps=3)
    assert inv.blocking().empty, inv.blocking()[["category", "line", "message"]].to_string()


def test_a_buffer_registered_from_a_host_copy_moves_with_its_module(tmp_path):
    """`register_buffer("inv_freq", inv.cpu())`, then `module.to(device)`: the buffer lives on the device."""
    d = 2 * random.randint(2, 16)
    src = textwrap.dedent(f"""
        import torch
        from torch import nn


        class Rope(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("inv_freq", (1.0 / 10000 ** (torch.arange(0, {d}, 2).float() / {d})).cpu())
                self.proj = nn.Linear({d}, {d})


        class Step:
            def __init__(self, device):
                self.rope = Rope().to(device)
                self.x = torch.randn(3, {d}, device=device)
                self.out = torch.zeros(3, {d // 2}, device=device)

            def prepare(self, i):
                self.x.normal_()

            @torch.no_grad()
            def step(self):
                f = self.rope.inv_freq.to(self.x.device)
                self.out.copy_(self.rope.proj(self.x)[:, :{d // 2}] * f)
                return self.out


        def make(device):
            return Step(device)
        """)
    (tmp_path / "rope_target.py").write_text(src)
    inv = audit.scan(f"{tmp_path / 'rope_target.py'}:make", device="cpu", steps=3)
    assert inv.blocking().empty, inv.blocking()[["category", "line", "message"]].to_string()
