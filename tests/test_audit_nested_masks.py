"""nn.TransformerEncoder's nested-tensor fast path reads the padding mask back to the host (two single C++
ops, nothing dispatched inside them): each is a host-sync on the line that ran the encoder; the padded path
(`enable_nested_tensor=False, mask_check=False`) is graph-ready. Fresh weights, inputs and masks each run."""

from __future__ import annotations

import textwrap

import audit

_TARGET = textwrap.dedent('''
    import torch
    from torch import nn

    class Encode:
        def __init__(self, device):
            layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 2, {options}).to(device).eval()
            self.x = torch.randn(3, 12, 32, device=device)
            self.pad = torch.zeros(3, 12, dtype=torch.bool, device=device)

        def prepare(self, i):
            self.x.copy_(torch.randn(3, 12, 32))
            self.pad.copy_(torch.arange(12)[None, :] >= torch.randint(4, 12, (3, 1)))

        @torch.no_grad()
        def step(self):
            return self.enc(self.x, src_key_padding_mask=self.pad)  # the encoder

    def make(device):
        return Encode(device)
''')


def _blocking(tmp_path, options):
    path = tmp_path / "encode.py"
    path.write_text(_TARGET.format(options=options))
    inv = audit.scan(f"{path}:make", device="cpu", steps=4)
    line = next(i for i, s in enumerate(path.read_text().splitlines(), 1) if s.endswith("# the encoder"))
    df = inv.df[inv.df.severity.isin(("blocks-capture", "silent-corruption"))]
    return line, df


def test_the_nested_fast_path_reads_the_padding_mask_on_the_host(tmp_path):
    line, df = _blocking(tmp_path, "enable_nested_tensor=True")
    syncs = df[df.category == "host-sync"]
    assert set(syncs.op) == {"aten._nested_tensor_from_mask", "aten._nested_tensor_from_mask_left_aligned"}, \
        df[["category", "op", "line"]].to_string()
    assert set(syncs.line.astype(int)) == {line} and syncs.file.astype(str).str.endswith("encode.py").all()


def test_the_padded_path_is_graph_ready(tmp_path):
    _, df = _blocking(tmp_path, "enable_nested_tensor=False, mask_check=False")
    assert df.empty, df[["category", "op", "line", "message"]].to_string()
