"""torch.multinomial without replacement, or with one sample, reads its probabilities back on the host before it
draws (max, min and row sums through `.item()` inside the kernel, below the dispatcher on a CPU scan): a host-sync
at the sampling line, `Categorical(...).sample()` included. Several samples with replacement, and a Gumbel-max or
exponential-race draw on the device, wait for nothing. Fresh sizes and data each run."""

from __future__ import annotations

import random
import textwrap

import audit

_TARGET = textwrap.dedent('''
    import torch

    class Sampler:
        def __init__(self, device):
            self.cell = torch.nn.GRUCell({h}, {h}).to(device)
            self.head = torch.nn.Linear({h}, {v}).to(device)
            self.h = torch.zeros({b}, {h}, device=device)
            self.x = torch.zeros({b}, {h}, device=device)
            self.out = torch.zeros({b}, dtype=torch.long, device=device)

        def prepare(self, i):
            self.x.copy_(torch.randn_like(self.x))

        @torch.no_grad()
        def step(self):
            self.h.copy_(self.cell(self.x, self.h))
            logits = self.head(self.h)
            probs = torch.softmax(logits, -1)
            {body}
            return self.out

    def make(device):
        return Sampler(device)
''')

_SYNCING = {
    "one": "self.out.copy_(torch.multinomial(probs, 1).squeeze(-1))  # sample",
    "no_replacement": "self.out.copy_(torch.multinomial(probs, 2, replacement=False)[:, 0])  # sample",
    "categorical": "self.out.copy_(torch.distributions.Categorical(probs=probs, validate_args=False).sample())  # sample",
}
_CLEAN = {
    "replacement": "self.out.copy_(torch.multinomial(probs, 3, True)[:, 0])  # sample",
    "replacement_kw": "self.out.copy_(torch.multinomial(probs, num_samples=2, replacement=True)[:, 0])  # sample",
    "exponential": "self.out.copy_((probs / torch.empty_like(probs).exponential_(1)).argmax(-1))  # sample",
}


def _blocking(body, tmp_path):
    path = tmp_path / "sampler.py"
    path.write_text(_TARGET.format(h=random.randint(8, 24), v=random.randint(20, 60), b=random.randint(1, 4),
                                   body=body))
    line = next(i for i, s in enumerate(path.read_text().splitlines(), 1) if s.endswith("# sample"))
    inv = audit.scan(f"{path}:make", device="cpu", steps=3)
    df = inv.df[inv.df.severity.isin(("blocks-capture", "silent-corruption"))]
    return line, df


def test_multinomial_that_validates_on_the_host_is_a_host_sync(tmp_path):
    for name, body in _SYNCING.items():
        line, df = _blocking(body, tmp_path)
        hits = df[(df.category == "host-sync") & ((df.line == line) | (df.caller_line == line))]
        assert len(hits), (name, df[["category", "op", "line"]].to_string())
        assert set(df.category) == {"host-sync"}, (name, df[["category", "op", "line"]].to_string())


def test_draws_that_read_nothing_back_are_clean(tmp_path):
    for name, body in _CLEAN.items():
        _, df = _blocking(body, tmp_path)
        assert df.empty, (name, df[["category", "op", "line"]].to_string())
