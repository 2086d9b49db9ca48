"""An NVFP4 copy of the tiny checkpoint: layout, logits within the quantization error of the FP8/FP4
original, and NVIDIA ModelOpt's tensor names accepted by the loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ckpt_util import SHARDS, bitwise_equal, fresh_seed, header, make_tiny, rewrite, state
from safetensors.torch import load_file

from dsv4.checkpoint import load_model
from dsv4.checkpoint_write import convert_checkpoint, convert_model
from dsv4.layers.linear import Linear


@pytest.fixture(scope="module", autouse=True)
def _fresh():
    fresh_seed()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("ckpt"))[0]


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return torch.randint(0, 1024, (2, 37))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def nvfp4(ckpt, tmp_path_factory) -> Path:
    return convert_checkpoint(ckpt, tmp_path_factory.mktemp("nv") / "tiny-nvfp4", fmt="nvfp4", progress=False)


def test_nvfp4_layout(nvfp4):
    raw = json.loads((nvfp4 / "config.json").read_text())
    assert raw["quantization_config"]["quant_method"] == "nvfp4" and raw["expert_dtype"] == "nvfp4"
    h = {k: v for n in SHARDS for k, v in header(nvfp4 / n).items()}
    assert h["layers.0.attn.wq_a.weight"] == ("I8", (128, 128))
    assert h["layers.0.attn.wq_a.scale"] == ("F8_E4M3", (128, 16))
    assert h["layers.0.attn.wq_a.global_scale"] == ("F32", ())
    assert h["layers.0.ffn.experts.3.w2.weight"] == ("I8", (256, 64))
    assert h["layers.0.ffn.experts.3.w2.scale"] == ("F8_E4M3", (256, 8))
    assert h["layers.1.attn.compressor.wkv.weight"] == ("BF16", (256, 256))  # bf16 stays bf16


def test_nvfp4_logits_within_quantization_error(ckpt, nvfp4, tokens):
    """Bound: in float32 mode the NVFP4 copy differs from the FP8/FP4 model only in its weights,
    each off by its NVFP4 rounding (relative Frobenius error eps ~ 7-10%: e2m1 has one mantissa
    bit; test_quantize bounds it per element). Propagated through the network that is the logit
    error that random weight noise of the same per-tensor size causes, so the NVFP4 logits must
    be within 3x the error of that noise control (ratio over 60 fresh seeds: median 1.06, max
    2.66, so 2x failed about one run in 30), and far below the ~1.4 relative distance between
    two unrelated models (a ratio of ~14 here)."""
    ref = load_model(ckpt, dtype="float32", progress=False)
    nv = load_model(nvfp4, dtype="float32", progress=False)
    control = convert_model(ref, "bf16")
    ref_mods, nv_mods = dict(ref.named_modules()), dict(nv.named_modules())
    eps = []
    with torch.no_grad():
        for name, mod in control.named_modules():
            if isinstance(mod, Linear) and nv_mods[name].fmt == "nvfp4":
                w = ref_mods[name].dequantized()
                err = (nv_mods[name].dequantized() - w).norm()
                eps.append((err / w.norm()).item())
                noise = torch.randn_like(w)
                mod.weight.copy_((w + noise * (err / noise.norm())).bfloat16())
    assert 0.03 < sum(eps) / len(eps) < 0.12 and max(eps) < 0.15, eps
    want = ref.prefill(tokens)
    got, ctl = _rel(nv.prefill(tokens), want), _rel(control.prefill(tokens), want)
    assert 0.005 < got <= 3 * ctl and got < 0.35, (got, ctl)
    # the released numerics (bf16 mode, FP8 activations) stay within the same order
    a = load_model(nvfp4, dtype="bfloat16", progress=False).prefill(tokens[:, :9])
    b = load_model(ckpt, dtype="bfloat16", progress=False).prefill(tokens[:, :9])
    assert _rel(a, b) < 0.35


def test_nvfp4_modelopt_names_accepted(nvfp4, tmp_path):
    """NVIDIA ModelOpt's names: weight U8, weight_scale, weight_scale_2, input_scale (ignored)."""
    nv_linears = {k.rsplit(".", 1)[0] for k in load_file(str(nvfp4 / SHARDS[0])) if k.endswith("global_scale")} | {
        k.rsplit(".", 1)[0] for k in load_file(str(nvfp4 / SHARDS[1])) if k.endswith("global_scale")}

    def modelopt(k, t):
        stem, leaf = k.rsplit(".", 1)
        if stem.removeprefix("model.") not in nv_linears:
            return {k: t}
        if leaf == "weight":
            return {k: t.view(torch.uint8), f"{stem}.input_scale": torch.tensor(1.0)}
        return {f"{stem}.{'weight_scale' if leaf == 'scale' else 'weight_scale_2'}": t}

    d = rewrite(nvfp4, tmp_path / "mo", rename=modelopt, prefix="model.")
    h = header(d / SHARDS[0]) | header(d / SHARDS[1])
    assert h["model.layers.0.attn.wq_a.weight_scale_2"] == ("F32", ())
    assert h["model.layers.0.attn.wq_a.weight"][0] == "U8" and "model.layers.0.attn.wq_a.input_scale" in h
    assert bitwise_equal(state(load_model(d, progress=False)), state(load_model(nvfp4, progress=False)))
