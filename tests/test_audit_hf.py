"""The auditor on Hugging Face transformers models it has never seen: tiny random configs built here,
nothing downloaded. Findings must name transformers' own lines (those of the installed copy, read
from its source here, never hard-coded), with the target's line that called the model as caller.

- a Llama decoder on DynamicCache: the cache's growth (torch.cat in cache_utils.py) is a
  dynamic-shape and an escaped allocation at that line;
- the same decoder on StaticCache: graph-ready (no blocking or silent finding at all), and a
  Qwen3 too, whose masks come as a dict per layer type (each staged like a tensor input);
- a Mixtral MoE decoder with the `eager` experts implementation: the nonzero and the Python loop
  over the experts hit are host-syncs in modeling_mixtral.py;
- `hf:DIR` without a wrapper file, `--cache`, `--batch`, `--prompt-len`; bad paths and unknown
  architectures are one line and exit 2.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

import audit  # noqa: E402
from audit.errors import AuditError  # noqa: E402
from test_audit_planted import BLOCKING  # noqa: E402

HERE = Path(__file__).parent
WRAPPER = HERE / "planted" / "hf_decode.py"
TF = Path(transformers.__file__).resolve().parent
# transformers 5.2x's generate drops an all-ones 2D attention mask before its loop (and records its length in
# GenerationConfig._mask_length); earlier versions pass it on, growing by a column per step
_KEEPS_MASK = "_mask_length" not in getattr(transformers.GenerationConfig, "__annotations__", {})
TINY = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)


def _lines(path: Path, pattern: str, within=None) -> set[int]:
    """Line numbers of the installed source file matching `pattern` (inside `within`'s source, if given)."""
    if within is not None:
        src, start = inspect.getsourcelines(within)
        return {start + i for i, t in enumerate(src) if re.search(pattern, t)}
    return {i for i, t in enumerate(path.read_text().splitlines(), 1) if re.search(pattern, t)}


def _rows(inv, category: str, file: str):
    df = inv.df
    return df[(df.category == category) & (df.file == file)]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    transformers.LlamaConfig(**TINY).save_pretrained(d)
    assert not list(d.glob("*.safetensors"))  # a config only: random weights
    return d


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixtral")
    transformers.MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2).save_pretrained(d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["experts_implementation"] = "eager"  # the Python loop over experts, as a user may pick it
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def dynamic_inv(llama_dir):
    return audit.scan(f"hf:{llama_dir}", device="cpu")


# ---------------------------------------------------------------------- DynamicCache
def test_dynamic_cache_growth_is_named_in_transformers_own_file(dynamic_inv):
    from transformers.cache_utils import DynamicLayer

    cat = _lines(TF / "cache_utils.py", r"self\.(keys|values) = torch\.cat\(", within=DynamicLayer.update)
    assert len(cat) == 2, cat
    for category in ("dynamic-shape", "step-allocation"):
        rows = _rows(dynamic_inv, category, "transformers/cache_utils.py")
        rows = rows[rows.severity.isin(BLOCKING)]
        assert set(rows.line.astype(int)) == cat, (category, rows[["line", "message"]].to_string())
    escaped = " ".join(_rows(dynamic_inv, "step-allocation", "transformers/cache_utils.py").message)
    assert "cache.layers.0.keys" in escaped or "cache.layers.1.keys" in escaped
    # no finding blames the audit's own driver, or sits outside transformers
    assert dynamic_inv.df.file.str.startswith("transformers/").all(), dynamic_inv.df.file.unique()


def test_every_dynamic_finding_is_explained(dynamic_inv):
    """The blocking findings of generate's dynamic-cache decode, each a real hazard of that flow:
    the cache's torch.cat (shape + escape) and, where the installed generate keeps the all-ones 2D
    attention mask, that mask growing by one column per step (new storage, new shape, and the host
    read in the SDPA mask shortcut that inspects it). Positions are generate's own `position_ids`,
    extended by one per step: the model's `position_ids is None` fallback (positions from the cache
    length, a Python int) is not what generate runs, so nothing is reported at it."""
    explained = {("transformers/cache_utils.py", "dynamic-shape"), ("transformers/cache_utils.py", "step-allocation")}
    if _KEEPS_MASK:
        explained |= {("transformers/masking_utils.py", c)
                      for c in ("baked-host-value", "dynamic-shape", "stale-input-pointer", "host-sync")}
    bad = dynamic_inv.blocking()
    assert set(zip(bad.file, bad.category)) <= explained, bad[["file", "line", "category", "message"]].to_string()
    fallback = _lines(TF / "models/llama/modeling_llama.py", r"past_seen_tokens")
    llama = dynamic_inv.df[dynamic_inv.df.file == "transformers/models/llama/modeling_llama.py"]
    assert fallback and not (set(llama.line.astype(int)) & fallback), llama[["line", "category"]].to_string()


def test_library_findings_name_the_architecture_line_that_called_them(dynamic_inv):
    """hf:DIR has no file of the user's: the architecture's own folder (models/llama/) is the model's code, so
    a finding in a shared utility (the cache's torch.cat, the mask helpers) names the modeling line that
    called into it: the attention's cache update, the model's mask construction."""
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaModel

    modeling = TF / "models/llama/modeling_llama.py"
    update = _lines(modeling, r"\.update\(", within=LlamaAttention.forward)
    mask = _lines(modeling, r"create_causal_mask\(", within=LlamaModel.forward)
    assert len(update) == 1 and len(mask) == 1
    bad = dynamic_inv.blocking()
    sites = [("transformers/cache_utils.py", update)] + [("transformers/masking_utils.py", mask)] * _KEEPS_MASK
    for file, want in sites:
        rows = bad[bad.file == file]
        assert len(rows), file
        assert set(rows.caller_file) == {"transformers/models/llama/modeling_llama.py"}, rows.caller_file.unique()
        assert set(rows.caller_line.astype(int)) == want, (file, rows[["line", "caller_line"]].to_string())


def test_wrapper_file_findings_name_the_line_that_called_the_model():
    call = next(n for n, t in enumerate(WRAPPER.read_text().splitlines(), 1) if "# CALLS:" in t and "self.model(" in t)
    inv = audit.scan(f"{WRAPPER}:make", device="cpu")
    bad = inv.blocking()
    assert len(bad) and bad.file.str.startswith("transformers/").all()
    assert set(bad.caller_file) == {"tests/planted/hf_decode.py"} and set(bad.caller_line) == {call}
    assert set(bad.caller_function) == {"step"}
    cat_lines = _rows(inv, "dynamic-shape", "transformers/cache_utils.py").line.astype(int)
    assert all("torch.cat" in (TF / "cache_utils.py").read_text().splitlines()[n - 1] for n in cat_lines)


# ---------------------------------------------------------------------- StaticCache
def test_static_cache_is_graph_ready(llama_dir):
    inv = audit.scan(f"hf:{llama_dir}", device="cpu", options={"cache": "static"})
    assert inv.meta["audited_steps"] == 4 and inv.meta["traced_ops"] > 0
    assert inv.blocking().empty, inv.blocking()[["file", "line", "category", "message"]].to_string()
    assert inv.meta["options"]["cache"] == "static"


def test_static_cache_wrapper_twin_is_graph_ready():
    inv = audit.scan(f"{WRAPPER}:make_clean", device="cpu")
    assert inv.blocking().empty, inv.blocking()[["file", "line", "category", "message"]].to_string()


def test_static_cache_dict_masks_are_staged(tmp_path):
    """Models with `layer_types` (Qwen3, Gemma2 ...) get a dict of masks, one per layer type, from
    prepare_inputs_for_generation: each entry is staged in a static buffer like any tensor input,
    so the mask is no stale-input-pointer and a static-cache Qwen3 is graph-ready like Llama."""
    transformers.Qwen3Config(**TINY, head_dim=8).save_pretrained(tmp_path)
    inv = audit.scan(f"hf:{tmp_path}", device="cpu", options={"cache": "static"})
    assert inv.blocking().empty, inv.blocking()[["file", "line", "category", "message"]].to_string()
    from audit.target_hf import HFDecode

    dec = HFDecode(f"hf:{tmp_path}", str(tmp_path), "cpu", cache="static", max_new_tokens=4)
    ptrs = []
    for i in range(2):
        dec.prepare(i)
        mask = dec.inputs["attention_mask"]
        assert isinstance(mask, dict) and mask
        ptrs.append({k: m.data_ptr() for k, m in mask.items()})
        dec.step()
    assert ptrs[0] == ptrs[1]


# ---------------------------------------------------------------------- MoE, eager experts
def test_moe_expert_loop_is_named_in_its_modeling_file(mixtral_dir):
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    inv = audit.scan(f"hf:{mixtral_dir}", device="cpu", options={"batch": 2, "prompt_len": 4})
    modeling = "transformers/models/mixtral/modeling_mixtral.py"
    fwd = MixtralExperts.forward
    nonzero = _lines(TF / "models/mixtral/modeling_mixtral.py", r"\.nonzero\(\)", within=fwd)
    loop = _lines(TF / "models/mixtral/modeling_mixtral.py", r"for expert_idx in expert_hit", within=fwd)
    assert len(nonzero) == 1 and len(loop) == 1
    sync = _rows(inv, "host-sync", modeling)
    lines = set(sync.line.astype(int))
    assert nonzero <= lines, sync[["line", "op"]].to_string()
    body_start = next(iter(loop))
    src, start = inspect.getsourcelines(fwd)
    body = set(range(body_start + 1, start + len(src)))
    assert lines & body, "no host-sync inside the expert loop"  # `if expert_idx == ...`, x[expert_idx]
    assert set(sync.function) == {"forward"}
    # one_hot(num_classes=...) reads min/max back on a CPU only: not a finding
    one_hot = _lines(TF / "models/mixtral/modeling_mixtral.py", r"one_hot\(", within=fwd)
    assert not (one_hot & lines)


# ---------------------------------------------------------------------- models with a cache of their own
@pytest.fixture(scope="module")
def minimax_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("minimax")
    transformers.MiniMaxConfig(**TINY, head_dim=8, num_local_experts=2, num_experts_per_tok=1,
                               layer_types=["linear_attention", "full_attention"]).save_pretrained(d)
    return d


def test_model_with_its_own_cache_decodes_on_it(minimax_dir):
    """generate hands MiniMax (and RWKV, xLSTM ...) no DynamicCache: the model makes its own in the
    prefill and generate carries it on. The target does the same, so the decode runs."""
    from audit.target_hf import HFDecode

    dec = HFDecode(f"hf:{minimax_dir}", str(minimax_dir), "cpu", max_new_tokens=4)
    assert type(dec.cache).__name__ == "MiniMaxCache"
    for i in range(2):
        dec.prepare(i)
        assert dec.inputs[dec.cache_key] is dec.cache
        dec.step()


def test_model_with_its_own_cache_refuses_a_static_cache(minimax_dir):
    from audit.target_hf import HFDecode

    with pytest.raises(AuditError, match="keeps a cache of its own"):
        HFDecode(f"hf:{minimax_dir}", str(minimax_dir), "cpu", cache="static")


# ---------------------------------------------------------------------- hf: targets, bad input
def test_config_json_path_batch_and_prompt_length(llama_dir):
    inv = audit.scan(f"hf:{llama_dir / 'config.json'}", device="cpu",
                     options={"cache": "static", "batch": 2, "prompt_len": 5})
    assert inv.meta["name"] == f"hf-{llama_dir.name}-static-b2-p5"
    assert inv.meta["options"] == {"cache": "static", "batch": 2, "prompt_len": 5}
    assert inv.blocking().empty


@pytest.mark.parametrize("make_spec, message", [
    (lambda d: "hf:/no/such/model/dir", "no such folder or file"),
    (lambda d: f"hf:{d / 'empty'}", "has no config.json"),
    (lambda d: f"hf:{d / 'unknown'}", "unknown architecture 'not_a_real_arch'"),
    (lambda d: f"hf:{d / 'notype'}", "has no model_type"),
])
def test_bad_hf_targets_are_one_line(tmp_path, make_spec, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "unknown").mkdir()
    (tmp_path / "unknown" / "config.json").write_text('{"model_type": "not_a_real_arch"}')
    (tmp_path / "notype").mkdir()
    (tmp_path / "notype" / "config.json").write_text('{"hidden_size": 8}')
    with pytest.raises(AuditError, match=re.escape(message)) as e:
        audit.scan(make_spec(tmp_path), device="cpu")
    assert "\n" not in str(e.value)


def test_cli_bad_hf_target_exits_2(tmp_path):
    from typer.testing import CliRunner

    import cli

    (tmp_path / "config.json").write_text('{"model_type": "not_a_real_arch"}')
    res = CliRunner().invoke(cli.app, ["scan", "--target", f"hf:{tmp_path}", "--device", "cpu",
                                       "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert "unknown architecture" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(cli.app, ["scan", "--target", "no_such_pkg.mod:make", "--device", "cpu"])
    assert res.exit_code == 2 and "no module named 'no_such_pkg.mod'" in res.output


def test_cli_hf_scan_with_options(llama_dir, tmp_path):
    from typer.testing import CliRunner

    import cli

    res = CliRunner().invoke(cli.app, ["scan", "--target", f"hf:{llama_dir}", "--cache", "static", "--batch", "2",
                                       "--prompt-len", "4", "--device", "cpu", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "inventory.json").read_text())
    assert data["summary"]["options"] == {"cache": "static", "batch": 2, "prompt_len": 4}
    res = CliRunner().invoke(cli.app, ["scan", "--target", "dsv4:tiny", "--cache", "static", "--device", "cpu"])
    assert res.exit_code == 2 and "--cache applies to hf:DIR targets" in res.output


def test_no_network(llama_dir, monkeypatch):
    """The hub is offline while an hf: target is built: any download attempt would raise."""
    import socket

    def refuse(*a, **k):
        raise AssertionError("hf: targets must never open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    inv = audit.scan(f"hf:{llama_dir}", device="cpu", steps=2, warmup=1, options={"cache": "static"})
    assert inv.meta["audited_steps"] == 2


def test_bisect_worker_builds_an_hf_target(llama_dir):
    """`bisect` builds targets through the same resolve(): the worker finds the decoder's layers."""
    from audit.capture.pool import _absolute_target
    from audit.capture.worker import Worker

    w = Worker({"target": _absolute_target(f"hf:{llama_dir}"), "device": "cpu", "options": {"cache": "static"}})
    info = w.start()
    assert info["label"].startswith("hf:") and len(info["layers"]) == TINY["num_hidden_layers"]
