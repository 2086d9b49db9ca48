"""`dsv4-audit generate` and dsv4/generate.py: the ids it prints are the model's greedy chain, the
rates are reported separately for prefill and decode, and every user mistake is one line with
exit code 2 and no traceback (checked through typer's CliRunner and once through a real process).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import dsv4
from cli import app
from dsv4.generate import check_room, generate, load_tokenizer, parse_ids

ROOT = Path(__file__).resolve().parents[1]






def _seed() -> int:
    return int.from_bytes(os.urandom(4), "little") % 2**31


def _run(*args: str):
    return CliRunner().invoke(app, ["generate", *args])


def _ids_line(output: str, label: str) -> list[int]:
    m = re.search(rf"^{label} ids \((\d+)\): ([\d,]+)$", output, re.MULTILINE)
    assert m, output
    ids = [int(v) for v in m.group(2).split(",")]
    assert len(ids) == int(m.group(1))
    return ids


def test_cli_prints_the_models_greedy_chain_and_both_rates():
    seed, g = _seed(), torch.Generator().manual_seed(_seed())
    prompt = torch.randint(0, 1024, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist()
    res = _run("--preset", "tiny", "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "5",
               "--dtype", "float32", "--seed", str(seed))
    assert res.exit_code == 0, res.output
    assert _ids_line(res.stdout, "prompt") == prompt
    printed = _ids_line(res.stdout, "generated")
    # the same chain by hand: argmax of prefill, then argmax of each decode step
    model = dsv4.load("tiny", dtype="float32", seed=seed)
    want = [int(model.prefill(torch.tensor([prompt])).argmax(-1))]
    for _ in range(4):
        want.append(int(model.decode(torch.tensor(want[-1:])).argmax(-1)))
    assert printed == want
    assert re.search(r"prefill: \d+ tokens in [\d.]+ s = [\d.]+ tokens/s; decode: 4 steps in [\d.]+ s = [\d.]+ "
                     r"tokens/s", res.stdout), res.stdout


def test_generate_api_batch_and_sampling_reproducible():
    seed = _seed()
    model = dsv4.load("tiny", dtype="float32", seed=seed)
    prompt = torch.randint(0, 1024, (2, 7))
    out = generate(model, prompt, 4)
    assert out.tokens.shape == (2, 4) and out.decode_steps == 3
    assert out.prefill_tok_s > 0 and out.decode_tok_s > 0
    for b in range(2):  # a batch generates what each sequence generates alone
        assert torch.equal(generate(model, prompt[b], 4).tokens[0], out.tokens[b])
    a = generate(model, prompt, 6, temperature=1.5, seed=seed).tokens
    assert torch.equal(a, generate(model, prompt, 6, temperature=1.5, seed=seed).tokens)
    assert generate(model, prompt, 1).decode_tok_s is None
    with pytest.raises(dsv4.DSV4Error, match="empty prompt"):
        generate(model, [], 3)


def test_parse_ids():
    ids = torch.randint(0, 10**6, (int(torch.randint(1, 20, (1,))),)).tolist()
    assert parse_ids(",".join(map(str, ids))) == ids
    assert parse_ids(" 4 , 5 ") == [4, 5]
    for bad in ("", "1,,2", "1,x", "-1", "1.5", "1;2", "1 2", ","):
        with pytest.raises(dsv4.DSV4Error):
            parse_ids(bad)


def test_check_room_counts_positions():
    check_room(10, 10, 1)  # the first new token comes from the prefill logits: no extra position
    check_room(10, 3, 8)
    for args in ((10, 11, 1), (10, 3, 9), (10, 3, 0)):
        with pytest.raises(dsv4.DSV4Error):
            check_room(*args)


def _write_tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "hello", "world"] + [f"w{i}" for i in range(1021)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(directory / "tokenizer.json"))


def test_tokenizer_from_checkpoint_dir(tmp_path):
    pytest.importorskip("tokenizers")
    with pytest.raises(dsv4.DSV4Error, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    _write_tokenizer(tmp_path)
    assert load_tokenizer(tmp_path).encode("hello w7 world").ids == [1, 10, 2]


def test_cli_prompt_text_through_checkpoint_tokenizer(tmp_path):
    """--prompt TEXT end to end: a synthetic checkpoint plus a tokenizer.json in the same dir."""
    pytest.importorskip("tokenizers")
    mc = pytest.importorskip("dsv4.checkpoint_write")
    seed = _seed()
    ck = mc.make_checkpoint("tiny", tmp_path / "ck", seed=seed, fmt="fp8", n_shards=1, force=True)
    _write_tokenizer(Path(ck))
    res = _run("--checkpoint", str(ck), "--prompt", "hello world w5", "--max-new-tokens", "3", "--dtype", "float32")
    assert res.exit_code == 0, res.output
    assert _ids_line(res.stdout, "prompt") == [1, 2, 8]
    model = dsv4.load("tiny", dtype="float32", seed=seed)  # the checkpoint holds the preset's weights
    assert _ids_line(res.stdout, "generated") == generate(model, [1, 2, 8], 3).tokens[0].tolist()
    assert "generated text: " in res.stdout


BAD_INPUTS = {
    "unknown preset": (["--preset", "no-such-model"], "unknown preset"),
    "prompt longer than the cache": (["--max-seq-len", "4", "--prompt-ids", "1,2,3,4,5"], "longer than the cache"),
    "no room to generate": (["--max-seq-len", "8", "--prompt-ids", "1,2,3", "--max-new-tokens", "7"], "max_seq_len"),
    "token id >= vocab": (["--prompt-ids", "1,1024"], "outside the vocabulary"),
    "bad --prompt-ids syntax": (["--prompt-ids", "1,two,3"], "--prompt-ids"),
    "empty --prompt-ids item": (["--prompt-ids", "1,,3"], "--prompt-ids"),
    "text prompt without tokenizer": (["--prompt", "hello"], "tokenizer"),
    "missing checkpoint dir": (["--checkpoint", "/no/such/dir"], "not a directory"),
    "unknown dtype": (["--dtype", "float16"], "dtype"),
    "zero new tokens": (["--max-new-tokens", "0"], "--max-new-tokens"),
    "--fuse without a static decoder": (["--fuse"], "--decoder eager, ab or full"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_cli_bad_input_is_one_line_exit_2(case):
    args, needle = BAD_INPUTS[case]
    res = _run(*args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.output


def test_console_script_bad_input_in_a_real_process():
    """The real entry point and stderr (bad syntax fails before any model is built)."""
    proc = subprocess.run([sys.executable, "-m", "cli", "generate", "--prompt-ids", "1,x"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.strip().count("\n") == 0 and "--prompt-ids" in proc.stderr
