"""Synthetic checkpoints in the released layout: writing, loading, renames, bad checkpoints.

Each module run writes a tiny checkpoint with a fresh random seed; the bad-checkpoint tests copy
it and break one thing each. Every error must be one DSV4Error line naming the file and the
tensor (or config field), and the CLI must turn it into exit code 2 without a traceback.
NVFP4 conversion is tested in test_checkpoint_nvfp4.py.
"""

from __future__ import annotations

import json
import math
import pickle
import shutil
import subprocess
import sys
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

import cli
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
    want = {  # from the "Released safetensors layout" section of DSV4_MODEL.md
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


# ------------------------------------------------------------------ bad checkpoints


def _edit_shard(path: Path, fn) -> None:
    tensors = load_file(str(path))
    fn(tensors)
    save_file(tensors, str(path))


def _drop_everywhere(d: Path, key: str) -> None:
    _edit_shard(d / SHARDS[0], lambda t: t.pop(key, None))
    _edit_shard(d / SHARDS[1], lambda t: t.pop(key, None))
    index = json.loads((d / INDEX).read_text())
    del index["weight_map"][key]
    (d / INDEX).write_text(json.dumps(index))


def _shard_of(d: Path, key: str) -> str:
    return json.loads((d / INDEX).read_text())["weight_map"][key]


def _truncate(d: Path) -> None:
    p = d / SHARDS[1]
    data = p.read_bytes()
    p.write_bytes(data[: len(data) - 1000])


def _replace_with_pickle(d: Path) -> None:
    for p in d.glob("*.safetensors"):
        p.unlink()
    (d / INDEX).unlink()
    (d / "pytorch_model.bin").write_bytes(pickle.dumps(_Trap(d / "UNPICKLED")))


def _index_points_to_pickle(d: Path) -> None:
    index = json.loads((d / INDEX).read_text())
    index["weight_map"] = {k: "pytorch_model-00001-of-00002.bin" for k in index["weight_map"]}
    (d / INDEX).write_text(json.dumps(index))
    (d / "pytorch_model-00001-of-00002.bin").write_bytes(pickle.dumps(_Trap(d / "UNPICKLED")))


def _pickle_named_safetensors(d: Path) -> None:
    torch.save({"embed.weight": torch.zeros(2)}, d / SHARDS[0])  # a zip archive with a pickle inside


class _Trap:
    """Unpickling this creates a marker file: the loader must never unpickle."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


BAD = {
    # case: (break it, the file the message names, a fragment it must contain)
    "missing-tensor": (lambda d: _drop_everywhere(d, "layers.1.attn.wkv.scale"), INDEX,
                       "missing tensor layers.1.attn.wkv.scale"),
    "missing-from-shard": (lambda d: _edit_shard(d / _shard_of(d, "norm.weight"), lambda t: t.pop("norm.weight")),
                           "model-0000", "no tensor norm.weight"),
    "missing-shard-file": (lambda d: (d / SHARDS[1]).unlink(), SHARDS[1], "shard missing"),
    "wrong-shape": (lambda d: _edit_shard(d / _shard_of(d, "layers.0.attn.wq_a.weight"), lambda t: t.update(
        {"layers.0.attn.wq_a.weight": t["layers.0.attn.wq_a.weight"][:64]})), "model-0000",
        "layers.0.attn.wq_a.weight has shape [64, 256], the config needs [128, 256]"),
    "wrong-dtype": (lambda d: _edit_shard(d / _shard_of(d, "head.weight"), lambda t: t.update(
        {"head.weight": t["head.weight"].float()})), "model-0000", "head.weight is F32, expected BF16"),
    "wrong-dtype-scale": (lambda d: _edit_shard(d / _shard_of(d, "layers.3.ffn.experts.5.w2.scale"), lambda t: t.update(
        {"layers.3.ffn.experts.5.w2.scale": t["layers.3.ffn.experts.5.w2.scale"].view(torch.uint8)})),
        "model-0000", "layers.3.ffn.experts.5.w2.scale is U8, expected F8_E8M0"),
    "unexpected-tensor": (lambda d: _edit_shard(d / SHARDS[0], lambda t: t.update(
        {"layers.9.attn.wq.weight": torch.zeros(2)})), SHARDS[0], "unexpected tensor layers.9.attn.wq.weight"),
    "truncated-shard": (_truncate, SHARDS[1], "truncated shard: tensor "),
    "missing-config-field": (lambda d: _edit_config(d, lambda c: c.pop("hidden_size")), "config.json",
                             "missing config field(s) hidden_size"),
    "unknown-model-type": (lambda d: _edit_config(d, lambda c: c.update(model_type="llama")), "config.json",
                           "unknown model_type 'llama'"),
    "no-config": (lambda d: (d / "config.json").unlink(), "config.json", "no config.json"),
    "pickle-file": (_replace_with_pickle, "pytorch_model.bin", "refusing to unpickle"),
    "index-to-pickle": (_index_points_to_pickle, "pytorch_model-00001-of-00002.bin", "refusing to unpickle"),
    "pickle-named-safetensors": (_pickle_named_safetensors, SHARDS[0], "refusing to unpickle"),
}


def _edit_config(d: Path, fn) -> None:
    raw = json.loads((d / "config.json").read_text())
    fn(raw)
    (d / "config.json").write_text(json.dumps(raw))


def _load_through_cli(directory: Path):
    """The real `dsv4-audit generate --checkpoint DIR` (it fails while loading)."""
    return cli_run("generate", "--checkpoint", str(directory), "--max-new-tokens", "1", "--dtype", "float32")


@pytest.mark.parametrize("case", list(BAD))
def test_bad_checkpoint_one_line_error(case, ckpt, tmp_path, monkeypatch):
    d = tmp_path / "bad"
    shutil.copytree(ckpt, d)
    breaker, file_part, fragment = BAD[case]
    breaker(d)
    monkeypatch.setattr(pickle, "load", _never)
    monkeypatch.setattr(pickle, "loads", _never)
    monkeypatch.setattr(torch, "load", _never)
    with pytest.raises(DSV4Error) as e:
        load_model(d, progress=False)
    msg = str(e.value)
    assert "\n" not in msg and fragment in msg and file_part in msg and str(d) in msg, msg
    r = _load_through_cli(d)
    assert r.exit_code == 2 and "Traceback" not in r.output and fragment in r.output, r.output
    assert not (d / "UNPICKLED").exists()


def _never(*a, **k):
    raise AssertionError("the loader unpickled something")


def test_old_safetensors_without_e8m0_is_a_clear_error(ckpt, monkeypatch):
    monkeypatch.setattr(C, "_e8m0_supported", lambda: False)
    with pytest.raises(DSV4Error, match=r"model-0000\d-of-00002\.safetensors: tensor \S+\.scale is F8_E8M0, which safetensors"):
        load_model(ckpt, progress=False)


def test_validation_happens_before_any_copy(ckpt, tmp_path):
    """A bad tensor in the last shard must fail before the first shard is copied into the model."""
    d = tmp_path / "bad"
    shutil.copytree(ckpt, d)
    last = sorted(json.loads((d / INDEX).read_text())["weight_map"].items())[-1][0]
    _edit_shard(d / _shard_of(d, last), lambda t: t.update({last: torch.zeros(3)}))
    model = Transformer(preset("tiny"))
    before = state(model)
    with pytest.raises(DSV4Error, match=last.replace(".", r"\.")):
        load_checkpoint(model, d, progress=False)
    assert bitwise_equal(state(model), before)


def test_failure_midway_never_leaves_a_usable_model(ckpt, monkeypatch):
    real = C.safe_open
    count = {"n": 0}

    class Flaky:
        def __init__(self, *a, **k):
            self.f = real(*a, **k)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def get_tensor(self, key):
            count["n"] += 1
            if count["n"] == 100:
                raise OSError("I/O error reading the shard")
            return self.f.get_tensor(key)

    monkeypatch.setattr(C, "safe_open", Flaky)
    model = Transformer(preset("tiny"))
    with pytest.raises(OSError):
        load_checkpoint(model, ckpt, progress=False)
    assert all(p.device.type == "meta" for p in model.parameters())
    with pytest.raises(Exception):
        model.prefill(torch.zeros(1, 4, dtype=torch.long))
    count["n"] = 0
    with pytest.raises(OSError):
        load_model(ckpt, progress=False)


def test_cli_error_is_one_line_in_a_real_process(ckpt):
    argv = ["make-checkpoint", "--out", str(ckpt)]
    from typer.main import get_command

    if not hasattr(get_command(cli.app), "commands"):
        argv = argv[1:]
    p = subprocess.run([sys.executable, "-c", "import cli; cli.app()", *argv], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
