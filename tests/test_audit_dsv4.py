"""The scan of the real model: the reference decode path's known hazards are found at the right
source lines (located from the source, not hard-coded), the static path comes out graph-ready,
and a scan leaves the model bit-identical to a plain run of the same steps."""

from __future__ import annotations

import hashlib
import inspect
import os
from pathlib import Path

import pytest
import torch

import audit
from audit.target import Dsv4Reference

pytest.importorskip("dsv4.model")
REPO = Path(__file__).resolve().parents[1]


def _lines(fn) -> tuple[str, range, list[str]]:
    """(file relative to the repo, line span, source lines) of a function."""
    fn = inspect.unwrap(fn)
    src, start = inspect.getsourcelines(fn)
    rel = os.path.relpath(inspect.getsourcefile(fn), REPO)
    return rel, range(start, start + len(src)), src


def _text(fn, line: int) -> str:
    _, span, src = _lines(fn)
    return src[line - span.start].strip()


@pytest.fixture(scope="module")
def reference():
    held = {}

    def make(device):
        held["obj"] = Dsv4Reference("tiny", device)
        return held["obj"]

    inv = audit.scan(make, device="cpu", steps=4, warmup=2)
    return inv, held["obj"]


def test_expert_dispatch_syncs_in_moe(reference):
    from dsv4.layers.moe import MoE

    inv, _ = reference
    rel, span, _ = _lines(MoE.forward)
    syncs = inv.where("host-sync", file=rel)
    assert not syncs.empty and set(syncs.line) <= set(span)
    assert {"Tensor.tolist", "aten.bincount"} <= set(syncs.op)
    assert any("bincount" in _text(MoE.forward, ln) and "tolist" in _text(MoE.forward, ln) for ln in syncs.line)
    ctl = inv.where("data-dependent-control", file=rel)
    assert any(_text(MoE.forward, ln).startswith(("for ", "if ")) for ln in ctl.line)


def test_compressor_emission_branch(reference):
    from dsv4.layers.compressor import Compressor

    inv, _ = reference
    rel, span, _ = _lines(Compressor.decode)
    ctl = inv.where("data-dependent-control", file=rel)
    hits = [ln for ln in ctl.line if ln in span]
    assert hits and all(_text(Compressor.decode, ln).startswith("if ") for ln in hits)
    assert (ctl.severity == "silent-corruption").all()


def test_python_positions_are_baked_or_dynamic(reference):
    from dsv4.layers.attention import Attention

    inv, _ = reference
    rel, span, _ = _lines(Attention.decode)
    baked = [ln for ln in inv.where("baked-host-value", file=rel).line if ln in span]
    dyn = [ln for ln in inv.where("dynamic-shape", file=rel).line if ln in span]
    assert baked and dyn
    assert all("pos" in _text(Attention.decode, ln) for ln in baked + dyn)


def test_position_counter_and_staging(reference):
    from dsv4.model import Transformer

    inv, _ = reference
    rel, _, _ = _lines(Transformer.decode)
    side = inv.where("cpu-side-effect", file=rel)
    assert any("self.pos" in _text(Transformer.decode, ln) for ln in side.line)
    assert inv.where("stale-input-pointer").message.str.contains("`ids`").any()  # the eager loop's fresh ids


def test_findings_point_into_the_model_not_the_tools(reference):
    inv, _ = reference
    assert inv.meta["traced_ops"] > 1000 and inv.meta["audited_steps"] == 4
    files = set(inv.df.file)
    assert all("dsv4/" in f and "audit/" not in f for f in files), files
    assert set(inv.blocking().category) >= {"host-sync", "data-dependent-control", "baked-host-value",
                                             "dynamic-shape", "cpu-side-effect"}


def _state_hash(obj) -> str:
    h = hashlib.sha256()
    model = obj.model
    tensors = sorted(model.state_dict().items())
    for i, layer in enumerate(model.layers):
        c = layer.attn.cache
        for name in ("window", "comp", "index_keys"):
            if getattr(c, name, None) is not None:
                tensors.append((f"cache{i}.{name}", getattr(c, name)))
        for st in ("comp_state", "index_state"):
            if getattr(c, st, None) is not None:
                tensors += [(f"cache{i}.{st}.kv", getattr(c, st).kv), (f"cache{i}.{st}.score", getattr(c, st).score)]
    for name, t in tensors:
        h.update(name.encode())
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    h.update(str(model.pos).encode())
    return h.hexdigest()


def test_scan_leaves_the_model_as_a_plain_run_would(reference):
    _, scanned = reference
    plain = Dsv4Reference("tiny", "cpu")
    for i in range(6):
        plain.prepare(i)
        plain.step()
    assert _state_hash(scanned) == _state_hash(plain)


def test_static_path_is_graph_ready():
    pytest.importorskip("dsv4.decode.static")
    inv = audit.scan("dsv4:tiny", path="static", steps=2, warmup=1)
    assert inv.meta["audited_steps"] == 2 and inv.meta["traced_ops"] > 1000
    assert inv.blocking().empty, inv.blocking()[["category", "file", "line", "message"]].to_string()
