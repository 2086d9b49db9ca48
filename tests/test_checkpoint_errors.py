"""Bad checkpoints: each test copies a fresh synthetic checkpoint and breaks one thing.

Every error must be one DSV4Error line naming the file and the tensor (or config field), raised
before any weight is copied, and the CLI must turn it into exit code 2 without a traceback.
"""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ckpt_util import SHARDS, bitwise_equal, cli_run, fresh_seed, make_tiny, state
from safetensors.torch import load_file, save_file

import cli
from dsv4 import checkpoint as C
from dsv4.checkpoint import INDEX, load_checkpoint, load_model
from dsv4.config import preset
from dsv4.errors import DSV4Error
from dsv4.model import Transformer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    fresh_seed()
    return make_tiny(tmp_path_factory.mktemp("ckpt"))[0]


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
