"""cpu-side-effect: a statement writing inside a container element named by a constant key is no site
of a change to another element.

A quantized layer keeps its monitoring in one dict attribute: a per-layer call counter the step bumps
(`self.book["<counter>"][self.tag] += 1`, the change a replay misses) and a second table it writes with
values that come out the same (`self.book["<table>"][self.tag] = self.cap`, a store, a `setdefault` or an
`update` inside that element). Only the counter's line is a site. When the second table does change,
its line is one too. Table names, sizes and the write's spelling are drawn fresh."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, marked_line, module_target, table, write_target

SAME = ['self.book["{t}"][self.tag] = self.cap  # OTHER',
        'self.book["{t}"].update({{self.tag: self.cap}})  # OTHER',
        'self.book["{t}"][self.tag] = max(self.book["{t}"][self.tag], self.cap)  # OTHER']
CHANGING = ['self.book["{t}"][self.tag] = float(len(self.book["{c}"]) + self.book["{c}"][self.tag])  # OTHER',
            'self.book["{t}"][self.tag] += 0.5  # OTHER']

LAYER = """
class QLayer(nn.Module):
    def __init__(self, d, tag, book):
        super().__init__()
        self.tag, self.book, self.cap = tag, book, {cap}
        w = torch.randn(d, d)
        s = w.abs().amax(1, keepdim=True) / 127.0
        self.register_buffer("q", torch.round(w / s).to(torch.int8))
        self.register_buffer("s", s)

    def forward(self, x):
        y = x @ (self.q.float() * self.s).t()
        self.book["{c}"][self.tag] += 1  # SITE
        {other}
        return y
"""


def _scan(tmp_path, kind):
    c, t = random.sample(["calls", "hits", "decode_steps", "seen"], 1)[0], random.choice(["peak", "limit", "clip"])
    tag = random.choice(["q_proj", "fc1", "down"])
    other = random.choice(SAME if kind == "same" else CHANGING).format(t=t, c=c)
    cap = round(random.uniform(1.0, 9.0), 3)
    tpl = module_target(
        prelude=LAYER.format(c=c, other=other, cap=cap).replace("{", "{{").replace("}", "}}"),
        init=f"        self.book = {{{{'{c}': {{{{'{tag}': 0}}}}, '{t}': {{{{'{tag}': {cap}}}}}}}}}\n"
             f"        self.layer = QLayer({{d}}, '{tag}', self.book)",
        step="        self.out.copy_(self.layer(self.x))\n        return self.out")
    path, site = write_target(tmp_path / "keyed.py", tpl, seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    return blocking(path), site, marked_line(path, "# OTHER")


@pytest.mark.parametrize("kind", ["same", "changing"])
def test_a_write_inside_an_unchanged_keyed_element_is_no_site(tmp_path, kind):
    bad, site, other = _scan(tmp_path, kind)
    effects = bad[bad.category == "cpu-side-effect"]
    assert len(at(bad, "cpu-side-effect", site)) == 1, table(bad)
    if kind == "same":
        assert len(effects) == 1, table(bad)
    else:
        assert len(at(bad, "cpu-side-effect", other)) == 1, table(bad)
