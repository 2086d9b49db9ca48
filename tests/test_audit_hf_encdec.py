"""hf: targets for encoder-decoder generators (T5, BART, Marian, Whisper), decoded as generate decodes them.

The encoder runs once, before the loop, on the prompt (or on log-mel features for a speech encoder); every
step is one decoder forward reading its outputs, on an EncoderDecoderCache whose self-attention half is the
cache asked for. Tiny random configs built here; nothing downloaded.
"""

from __future__ import annotations

import inspect
import random
import re
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import audit  # noqa: E402
from audit.target_hf import HFDecode  # noqa: E402

TF = Path(transformers.__file__).resolve().parent


def _t5(d: Path, seed: int) -> Path:
    rng = random.Random(seed)
    transformers.T5Config(vocab_size=rng.choice([96, 128]), d_model=32, d_kv=8, d_ff=64, num_layers=2,
                          num_decoder_layers=2, num_heads=4, decoder_start_token_id=0, pad_token_id=0,
                          eos_token_id=1).save_pretrained(d)
    return d


def _whisper(d: Path) -> Path:
    transformers.WhisperConfig(vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2,
                               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                               decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=24,
                               max_target_positions=64, decoder_start_token_id=3, pad_token_id=0, bos_token_id=3,
                               eos_token_id=2, suppress_tokens=None, begin_suppress_tokens=None).save_pretrained(d)
    return d


def test_the_encoder_runs_once_and_the_steps_decode_as_generate(tmp_path):
    seed = random.randrange(2**31)
    d = _t5(tmp_path / "t5", seed)
    t = HFDecode("hf:t5", str(d), "cpu", seed=seed % 1000, prompt_len=random.choice([5, 7]))
    assert isinstance(t.cache, transformers.EncoderDecoderCache)
    assert t.input_ids.shape == (1, 1) and int(t.input_ids[0, 0]) == 0  # the decoder start token
    calls = []
    t.model.get_encoder().register_forward_hook(lambda *a: calls.append(1))
    steps = 5
    for i in range(steps):
        t.prepare(i)
        t.step()
    assert not calls, "a decode step ran the encoder"
    decoded = torch.cat([t.input_ids, t.next[:, None]], -1)  # start token + the prefill's + every step's token
    # the reference: greedy decoding with the whole prefix each time and no cache (generate's min_new_tokens
    # would mask the end-of-sequence token, which a random model may well pick)
    ref = decoded[:, :1]
    with torch.no_grad():
        for _ in range(steps + 1):
            logits = t.model(input_ids=t.prompt_ids, decoder_input_ids=ref, use_cache=False).logits
            ref = torch.cat([ref, logits[:, -1].argmax(-1, keepdim=True)], -1)
    assert decoded.tolist() == ref.tolist()


def test_a_growing_self_attention_cache_is_named_in_transformers(tmp_path):
    from transformers.cache_utils import DynamicLayer

    d = _t5(tmp_path / "t5", random.randrange(2**31))
    inv = audit.scan(f"hf:{d}", device="cpu", steps=3)
    src, start = inspect.getsourcelines(DynamicLayer.update)
    cat = {start + i for i, s in enumerate(src) if re.search(r"self\.(keys|values) = torch\.cat\(", s)}
    df = inv.df
    dyn = df[(df.category == "dynamic-shape") & (df.file == "transformers/cache_utils.py")]
    assert set(dyn.line) == cat, df[["category", "file", "line"]].to_string()
    assert set(dyn.caller_file) == {"transformers/models/t5/modeling_t5.py"}
    static = audit.scan(f"hf:{d}", device="cpu", steps=3, options={"cache": "static"}).df
    assert not ((static.category == "dynamic-shape") | ((static.category == "step-allocation")
                                                        & (static.severity != "info"))).any(), static.to_string()


def test_a_speech_encoder_reads_log_mel_features(tmp_path):
    d = _whisper(tmp_path / "whisper")
    t = HFDecode("hf:whisper", str(d), "cpu")
    enc = t.model_kwargs["encoder_outputs"][0]
    assert enc.shape[:2] == (1, 24)  # one position per two frames of 2 * max_source_positions
    assert "attention_mask" not in t.model_kwargs
    inv = audit.scan(f"hf:{d}", device="cpu", steps=3, options={"cache": "static"})
    assert inv.meta["audited_steps"] == 3
    assert not (inv.df.category == "dynamic-shape").any(), inv.df.to_string()


def test_an_encoder_decoder_config_decodes_with_its_generator(tmp_path):
    from audit.target_hf import _auto_class

    cfg = transformers.BartConfig(vocab_size=64, d_model=16)
    assert _auto_class(cfg) is transformers.AutoModelForSeq2SeqLM  # not BartForCausalLM
    assert _auto_class(transformers.LlamaConfig()) is transformers.AutoModelForCausalLM


def test_bisect_bisects_the_decoder_blocks_that_run_in_the_step(tmp_path):
    """The encoder's blocks ran before the step and each decoder block holds a list of sublayers: the layers
    to capture one by one are the decoder's blocks."""
    from audit.capture.pool import _absolute_target
    from audit.capture.worker import Worker

    d = _t5(tmp_path / "t5", random.randrange(2**31))
    info = Worker({"target": _absolute_target(f"hf:{d}"), "device": "cpu", "options": {"cache": "static"}}).start()
    assert info["layers"] == ["model.decoder.block.0", "model.decoder.block.1"]


def test_no_decoder_start_token_is_one_line(tmp_path):
    from audit.errors import AuditError

    d = tmp_path / "t5"
    transformers.T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4).save_pretrained(d)
    with pytest.raises(AuditError, match="names no decoder_start_token_id") as e:
        audit.scan(f"hf:{d}", device="cpu", steps=2)
    assert "\n" not in str(e.value)
