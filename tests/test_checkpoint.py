"""Synthetic checkpoints in the released layout: writing, loading, renames, MTP tensors.

Each module run writes a tiny checkpoint with a fresh random seed. Bad checkpoints are in
test_checkpoint_errors.py, NVFP4 conversion in test_checkpoint_nvfp4.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from ckpt_util import (
    SHARDS,
    bitwise_equal,
    cli_run,
    fresh_seed,
    header,
    make_tiny,
    rewrite,
    state,
)
from safetensors.torch import load_file, save_file

import dsv4
from dsv4 import checkpoint as C
from dsv4.checkpoint import INDEX, load_checkpoint, load_model, read_config
from dsv4.config import preset
from dsv4.errors import DSV4Error
from dsv4.model import Transformer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def _fresh():
    fresh_seed()


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, int]:
    return make_tiny(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def ckpt(made) -> Path:
    return made[0]


@pytest.fixture(scope="module")
def seed(made) -> int:
    return made[1]


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return torch.randint(0, 1024, (2, 37))


# ------------------------------------------------------------------ layout


def test_written_layout_is_the_released_one(ckpt, seed):
    cfg = preset("tiny")
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(["config.json", INDEX, *SHARDS])
    raw = json.loads((ckpt / "config.json").read_text())
    assert raw["model_type"] == "deepseek_v4" and raw["hidden_size"] == 256 and raw["expert_dtype"] == "fp4"
    assert raw["quantization_config"] == {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                          "scale_fmt": "ue8m0", "activation_scheme": "dynamic"}
    assert read_config(ckpt) == cfg
    index = json.loads((ckpt / INDEX).read_text())
    heads = {name: header(ckpt / name) for name in SHARDS}
    assert all(heads.values())  # both shards hold tensors
    everything = {k: v for h in heads.values() for k, v in h.items()}
    assert index["weight_map"] == {k: n for n, h in heads.items() for k in h}
    nbytes = sum(math.prod(s) * C.DTYPES[d].itemsize for d, s in everything.values())
    assert index["metadata"]["total_size"] == nbytes
    d, V, q, inter, E = cfg.dim, cfg.vocab_size, cfg.q_lora_rank, cfg.moe_inter_dim, cfg.n_routed_experts
    want = {  # from the "Released safetensors layout" section of docs/model.md
        "embed.weight": ("BF16", (V, d)), "head.weight": ("BF16", (V, d)), "norm.weight": ("BF16", (d,)),
        "hc_head_fn": ("F32", (4, 4 * d)), "hc_head_base": ("F32", (4,)), "hc_head_scale": ("F32", (1,)),
        "layers.0.hc_attn_fn": ("F32", (24, 4 * d)), "layers.0.hc_ffn_scale": ("F32", (3,)),
        "layers.0.attn.attn_sink": ("F32", (cfg.n_heads,)),
        "layers.0.attn.wq_a.weight": ("F8_E4M3", (q, d)), "layers.0.attn.wq_a.scale": ("F8_E8M0", (1, 2)),
        "layers.0.attn.wq_b.weight": ("F8_E4M3", (cfg.n_heads * cfg.head_dim, q)),
        "layers.0.ffn.gate.weight": ("BF16", (E, d)), "layers.0.ffn.gate.tid2eid": ("I64", (V, 2)),
        "layers.2.ffn.gate.bias": ("F32", (E,)),
        "layers.0.ffn.experts.7.w1.weight": ("I8", (inter, d // 2)),
        "layers.0.ffn.experts.7.w1.scale": ("F8_E8M0", (inter, d // 32)),
        "layers.0.ffn.experts.7.w2.weight": ("I8", (d, inter // 2)),
        "layers.0.ffn.experts.7.w2.scale": ("F8_E8M0", (d, inter // 32)),
        "layers.0.ffn.shared_experts.w1.weight": ("F8_E4M3", (inter, d)),
        "layers.1.attn.compressor.ape": ("F32", (4, 2 * cfg.head_dim)),
        "layers.2.attn.compressor.ape": ("F32", (128, cfg.head_dim)),
        "layers.1.attn.indexer.wq_b.weight": ("F8_E4M3", (16 * 128, q)),
        "layers.1.attn.indexer.compressor.ape": ("F32", (4, 256)),
        "mtp.0.e_proj.weight": ("F8_E4M3", (d, d)), "mtp.0.hc_head_fn": ("F32", (4, 4 * d)),
    }
    for k, v in want.items():
        assert everything[k] == v, k
    assert "layers.0.ffn.gate.bias" not in everything and "layers.2.ffn.gate.tid2eid" not in everything
    assert not list(ckpt.parent.glob(".*"))  # no temp dirs left behind


def test_make_checkpoint_refuses_a_non_empty_output(ckpt, tmp_path):
    before = {p.name: p.stat().st_mtime_ns for p in ckpt.iterdir()}
    r = cli_run("make-checkpoint", "--out", str(ckpt))
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert str(ckpt) in r.output and "not empty" in r.output
    assert before == {p.name: p.stat().st_mtime_ns for p in ckpt.iterdir()}


def test_force_replaces_a_non_empty_output(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "junk.txt").write_text("old")
    r = cli_run("make-checkpoint", "--out", str(out), "--shards", "1", "--force")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temp or trash dirs left


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    import dsv4.checkpoint_write as W

    calls = []

    def failing(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        save_file(tensors, path, metadata=metadata)

    monkeypatch.setattr(W, "save_file", failing)
    with pytest.raises(OSError, match="disk full"):
        W.make_checkpoint("tiny", tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == []  # neither the output nor a temp dir


# ------------------------------------------------------------------ loading


def test_loaded_equals_preset(ckpt, seed, tokens):
    ref = dsv4.load("tiny", seed=seed, dtype="float32")
    got = dsv4.load(str(ckpt), dtype="float32")
    assert bitwise_equal(state(got), state(ref))
    logits = got.prefill(tokens)
    assert torch.equal(logits, ref.prefill(tokens))
    assert torch.isfinite(logits).all() and 0.1 < logits.std() < 10  # activations stayed O(1) through depth
    for _ in range(3):
        nxt = torch.randint(0, 1024, (2,))
        assert torch.equal(got.decode(nxt), ref.decode(nxt))
    # the released numerics too (bf16 mode is slow on CPU: a short prompt)
    a, b = dsv4.load(str(ckpt), dtype="bfloat16"), dsv4.load("tiny", seed=seed, dtype="bfloat16")
    assert torch.equal(a.prefill(tokens[:1, :9]), b.prefill(tokens[:1, :9]))


def test_parameter_bytes_match_disk_bytes(ckpt):
    model = load_model(ckpt, progress=True)
    param_bytes = sum(v.numel() * v.element_size() for v in model.state_dict().values())
    total = json.loads((ckpt / INDEX).read_text())["metadata"]["total_size"]
    disk = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
    assert param_bytes == total  # weights stay in FP8 / packed FP4 in memory, not upcast
    assert 0.99 * disk <= param_bytes <= disk


def test_renames_prefix_and_single_shard(ckpt, tmp_path):
    def hf(k, t):
        parts = [{"attn": "self_attn", "ffn": "mlp", "scale": "weight_scale_inv",
                  "bias": "e_score_correction_bias"}.get(p, p) for p in k.split(".")]
        return {".".join(parts): t}

    ref = state(load_model(ckpt, progress=False))
    variants = {
        "prefixed-1": rewrite(ckpt, tmp_path / "p1", prefix="model.", n_shards=1),
        "hf-3": rewrite(ckpt, tmp_path / "hf3", rename=hf, prefix="model.", n_shards=3),
        "bare-1": rewrite(ckpt, tmp_path / "b1", n_shards=1),
    }
    hdr = header(tmp_path / "hf3" / "model-00001-of-00003.safetensors")
    assert any(".self_attn." in k and k.endswith("weight_scale_inv") for k in hdr)
    for name, d in variants.items():  # same bytes in every tensor -> same logits
        assert bitwise_equal(state(load_model(d, progress=False)), ref), name


def test_inference_style_config(ckpt, tmp_path):
    import dataclasses

    cfg = preset("tiny")
    raw = {k: v for k, v in dataclasses.asdict(cfg).items()
           if k not in ("dtype", "max_seq_len", "max_batch_size", "weight_fmt", "expert_fmt")}
    raw.update(dtype="fp8", expert_dtype="fp4")
    d = rewrite(ckpt, tmp_path / "inf", config=lambda _: raw)
    assert read_config(d) == cfg
    assert bitwise_equal(state(load_model(d, progress=False)), state(load_model(ckpt, progress=False)))


def test_mtp_tensors_accepted_and_ignored(ckpt, tmp_path, tokens):
    ref = load_model(ckpt, dtype="float32", progress=False)
    # config says no MTP layer, the weights have one: accepted, ignored
    no_mtp_cfg = rewrite(ckpt, tmp_path / "cfg0", config=lambda raw: {**raw, "num_nextn_predict_layers": 0})
    m0 = load_model(no_mtp_cfg, dtype="float32", progress=False)
    assert len(m0.mtp) == 0 and not any(k.startswith("mtp.") for k in m0.state_dict())
    # weights shipped without MTP: the model is built without it
    stripped = rewrite(ckpt, tmp_path / "strip", rename=lambda k, t: {} if k.startswith("mtp.") else {k: t})
    m1 = load_model(stripped, dtype="float32", progress=False)
    assert len(m1.mtp) == 0
    want = ref.prefill(tokens)
    assert torch.equal(m0.prefill(tokens), want) and torch.equal(m1.prefill(tokens), want)
    # but a model that has an MTP layer needs its tensors
    with pytest.raises(DSV4Error, match=r"missing tensor mtp\.0\."):
        load_checkpoint(Transformer(preset("tiny")), stripped, progress=False)
    # releases that ship the MTP layer's own copies of the shared embedding and head load too
    def with_copies(k, t):
        extra = {"embed.weight": "mtp.0.emb.tok_emb.weight", "head.weight": "mtp.0.head.weight"}
        return {k: t, extra[k]: t.clone()} if k in extra else {k: t}
    copies = rewrite(ckpt, tmp_path / "copies", rename=with_copies)
    shipped = {k for f in copies.glob("*.safetensors") for k in load_file(str(f))}
    assert {"mtp.0.emb.tok_emb.weight", "mtp.0.head.weight"} <= shipped
    m2 = load_model(copies, dtype="float32", progress=False)
    assert len(m2.mtp) == 1 and bitwise_equal(state(m2), state(ref))
