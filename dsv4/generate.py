"""Token generation on the reference path, with prefill and decode timed separately.

The CLI's `generate` command is a thin shell over this module, so tests and benchmarks can drive
the same loop in-process. Prefill and decode are timed apart because they are different regimes
(prefill is compute-bound over the prompt, decode is one token per step) and a single tokens/s
figure would hide both. Every user mistake (bad ids, a prompt that does not fit the cache, a
missing tokenizer) is a DSV4Error, which the CLI prints as one line with exit code 2.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dsv4.errors import DSV4Error

__all__ = ["Generation", "generate", "load_model", "load_tokenizer", "parse_ids", "decoder_for"]

DECODERS = ("reference", "eager", "ab", "full")


@dataclass
class Generation:
    prompt: torch.Tensor   # [B, T] prompt ids (cpu)
    tokens: torch.Tensor   # [B, N] generated ids (cpu)
    prefill_s: float       # prefill of the prompt, including picking the first new token
    decode_s: float        # the N-1 decode steps that produce the remaining tokens

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt.numel() / max(self.prefill_s, 1e-9)

    @property
    def decode_steps(self) -> int:
        return self.tokens.shape[1] - 1

    @property
    def decode_tok_s(self) -> float | None:
        """Generated tokens per second over the decode steps (all sequences); None without any."""
        if self.decode_steps == 0:
            return None
        return self.tokens.shape[0] * self.decode_steps / max(self.decode_s, 1e-9)


def parse_ids(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3]; anything else is a one-line DSV4Error naming the bad piece."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p for p in parts):
        raise DSV4Error(f"--prompt-ids must be comma-separated token ids like 1,2,3; got {text!r}")
    ids = []
    for p in parts:
        if not p.isdigit():  # rejects signs, spaces inside, floats, words
            raise DSV4Error(f"--prompt-ids: {p!r} is not a non-negative integer token id (got {text!r})")
        ids.append(int(p))
    return ids


def load_model(preset: str | None = None, checkpoint: str | Path | None = None, device: str = "cpu",
               dtype: str = "bfloat16", seed: int = 0, max_seq_len: int | None = None):
    """A preset (seeded random weights) or a checkpoint directory, through `dsv4.load`."""
    import dsv4

    if preset is not None and checkpoint is not None:
        raise DSV4Error("give either --preset or --checkpoint, not both")
    try:
        torch.device(device)
    except RuntimeError:
        raise DSV4Error(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    runtime = {} if max_seq_len is None else {"max_seq_len": max_seq_len}
    if checkpoint is not None:
        if not Path(checkpoint).is_dir():
            raise DSV4Error(f"--checkpoint {checkpoint}: not a directory")
        try:
            return dsv4.load(str(checkpoint), device=device, dtype=dtype, seed=seed, **runtime)
        except ModuleNotFoundError as e:
            if e.name != "dsv4.checkpoint":
                raise
            raise DSV4Error("loading a checkpoint needs dsv4/checkpoint.py, which this install lacks") from None
    return dsv4.load(preset or "tiny", device=device, dtype=dtype, seed=seed, **runtime)


def load_tokenizer(directory: str | Path | None):
    """The `tokenizers` Tokenizer from DIR/tokenizer.json (text prompts need a checkpoint's tokenizer)."""
    if directory is None:
        raise DSV4Error("--prompt needs --checkpoint DIR with a tokenizer.json; for presets use --prompt-ids")
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        raise DSV4Error(f"--prompt needs a tokenizer: {path} does not exist (use --prompt-ids instead)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DSV4Error("--prompt needs the `tokenizers` package: pip install tokenizers") from None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - the library raises a bare Exception on a malformed file
        raise DSV4Error(f"{path}: not a valid tokenizer.json ({str(e).splitlines()[0] if str(e) else e})") from None


def check_room(max_seq_len: int, prompt_len: int, max_new_tokens: int) -> None:
    """Refuses, before any compute, a request the cache cannot hold.

    N new tokens need N-1 decode steps after the prompt (the first comes from the prefill
    logits), so the sequence occupies prompt_len + N - 1 positions.
    """
    if max_new_tokens < 1:
        raise DSV4Error(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if prompt_len > max_seq_len:
        raise DSV4Error(f"prompt of {prompt_len} tokens is longer than the cache (max_seq_len={max_seq_len})")
    need = prompt_len + max_new_tokens - 1
    if need > max_seq_len:
        raise DSV4Error(f"prompt ({prompt_len}) + {max_new_tokens} new tokens need {need} positions; the cache "
                        f"holds max_seq_len={max_seq_len} (raise --max-seq-len or lower --max-new-tokens)")


class _GraphDecoding:
    """The model interface generate() drives (cfg, device, prefill, decode) over a CUDAGraphDecoder."""

    def __init__(self, model, dec):
        self.cfg, self.device, self.dec = model.cfg, model.device, dec

    def prefill(self, tokens):
        return self.dec.prefill(tokens)

    def decode(self, ids):
        return self.dec.decode(ids.cpu())


def decoder_for(model, decoder: str, batch_size: int = 1, fuse: bool = False):
    """`reference` decodes with the model itself; eager / ab / full go through CUDAGraphDecoder
    (`fuse`: its layers compiled by inductor first, dsv4/decode/fuse.py)."""
    if decoder not in DECODERS:
        raise DSV4Error(f"unknown --decoder {decoder!r}; choose one of {', '.join(DECODERS)}")
    if decoder == "reference":
        if fuse:
            raise DSV4Error("--fuse applies to the static decoders: use --decoder eager, ab or full")
        return model, None
    from dsv4.decode.graph import CUDAGraphDecoder

    dec = CUDAGraphDecoder(model, mode=decoder, batch_size=batch_size, fuse=fuse)
    return _GraphDecoding(model, dec), dec


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def generate(model, prompt, max_new_tokens: int, temperature: float = 0.0, seed: int = 0) -> Generation:
    """Prefill `prompt` (list of ids, [T] or [B, T]) and generate max_new_tokens per sequence.

    temperature 0 is greedy (argmax); above 0 samples softmax(logits / temperature) with a
    generator seeded by `seed`, so a run is reproducible.
    """
    if temperature < 0:
        raise DSV4Error(f"--temperature must be >= 0, got {temperature}")
    tokens = torch.as_tensor(prompt, dtype=torch.int64)
    if tokens.numel() == 0:
        raise DSV4Error("empty prompt: give at least one token")
    if tokens.dim() == 1:
        tokens = tokens[None]
    check_room(model.cfg.max_seq_len, tokens.shape[-1], max_new_tokens)
    device = model.device
    gen = torch.Generator(device=device).manual_seed(seed) if temperature > 0 else None

    def pick(logits: torch.Tensor) -> torch.Tensor:
        if gen is None:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=gen)[:, 0]

    _sync(device)
    t0 = time.perf_counter()
    nxt = pick(model.prefill(tokens))
    _sync(device)
    t1 = time.perf_counter()
    out = [nxt]
    for _ in range(max_new_tokens - 1):
        nxt = pick(model.decode(nxt))
        out.append(nxt)
    _sync(device)
    t2 = time.perf_counter()
    return Generation(tokens.cpu(), torch.stack(out, dim=1).cpu(), t1 - t0, t2 - t1)
