"""A dict a forward hook fills through its closure, which the factory also hung on the model: one change,
reported at the hook's store that ran, not also at the factory's `net.stats = stats`."""

from __future__ import annotations

import random
import textwrap

import audit

SRC = textwrap.dedent('''
    import torch

    class Net(torch.nn.Module):
        def __init__(self, width):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(2))
            self.register_buffer("x", torch.zeros(2, width))

        def prepare(self, i):
            self.x.copy_(torch.randn(self.x.shape))

        @torch.no_grad()
        def step(self):
            h = self.x
            for layer in self.layers:
                h = torch.tanh(layer(h))
            return h

    def make(device="cpu"):
        net = Net(WIDTH).to(device)
        stats = {}
        def hook(mod, inp, out):
            stats[id(mod)] = out.norm().item()  # the store
        for layer in net.layers:
            layer.register_forward_hook(hook)
        net.stats = stats  # attached
        return net
''')


def _line(src: str, text: str) -> int:
    return next(n for n, t in enumerate(src.splitlines(), 1) if text in t)


def test_the_hooks_store_is_the_one_site(tmp_path):
    src = SRC.replace("WIDTH", str(random.randint(8, 48)))
    path = tmp_path / "hooked_stats.py"
    path.write_text(src)
    inv = audit.scan(f"{path}:make", device="cpu", steps=4)
    rows = inv.df[inv.df.category == "cpu-side-effect"]
    assert set(rows.line.astype(int)) == {_line(src, "# the store")}, rows[["line", "function", "message"]].to_string()
    sync = inv.df[inv.df.category == "host-sync"]
    assert set(sync.line.astype(int)) == {_line(src, "# the store")}
