"""Writes checkpoints in the released layout: seeded synthetic ones, and format conversions.

Layout written (what dsv4/checkpoint.py reads, and what the released repos ship): an HF-style
config.json (`ModelConfig.to_hf_dict()`: every field transformers' DeepseekV4Config reads, so a bf16
checkpoint loads in DeepseekV4ForCausalLM), shards `model-0000i-of-0000n.safetensors` with the
bare released key names and dtypes, and `model.safetensors.index.json` with
`metadata.total_size` (tensor bytes) and `weight_map` (a single shard is `model.safetensors`
with no index). Everything is written into a hidden sibling directory and renamed into place
at the end, so a crash or Ctrl-C never leaves a half-written checkpoint at the output path.

NVFP4 tensor names: a linear in NVFP4 stores `weight` (I8, two e2m1 codes per byte, low nibble =
even element, as FP4 experts do), `scale` (F8_E4M3 [out, in/16]) and `global_scale` (F32 []),
value = e2m1 * scale * global_scale. These are the model's own parameter names and follow the
released `scale` naming. The one published NVFP4 DeepSeek convention (NVIDIA ModelOpt, e.g.
nvidia/DeepSeek-R1-0528-FP4: `weight` U8, `weight_scale`, `weight_scale_2`, `input_scale`) has
the same math and nibble order; the loader accepts those names too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import torch
from safetensors.torch import save_file

from dsv4.checkpoint import INDEX, SINGLE, _progress, load_model
from dsv4.errors import DSV4Error

__all__ = ["save_checkpoint", "make_checkpoint", "convert_model", "convert_checkpoint", "FORMATS"]

# --format -> (dense projections, routed experts)
FORMATS = {"fp8": ("fp8", "fp4"), "nvfp4": ("nvfp4", "nvfp4"), "bf16": ("bf16", "bf16")}


@contextlib.contextmanager
def atomic_dir(out: str | Path, force: bool = False) -> Iterator[Path]:
    """Yields a fresh temp dir next to `out`; renames it to `out` only if the body succeeds."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DSV4Error(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise DSV4Error(f"{out}: already exists and is not empty (pass --force to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        for f in tmp.iterdir():  # data on disk before the rename makes it visible
            with f.open("rb") as fh:
                os.fsync(fh.fileno())
            f.chmod(0o666 & ~umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp made it private
        if out.is_dir() and any(out.iterdir()):
            trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            out.rename(trash / out.name)
            tmp.rename(out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, out)  # also replaces an existing empty directory
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _split(sizes: list[int], n: int) -> list[int]:
    """Shard index per tensor: contiguous runs (layers stay together) of about equal bytes."""
    total, acc, out = sum(sizes), 0, []
    for s in sizes:
        out.append(min(n - 1, int(acc * n // max(total, 1))))
        acc += s
    return out


def save_checkpoint(model: torch.nn.Module, out: str | Path, n_shards: int = 2, force: bool = False,
                    progress: bool = True) -> Path:
    """model (its config and state_dict) -> DIR in the released layout; returns DIR."""
    if n_shards < 1:
        raise DSV4Error("the number of shards must be at least 1")
    state = {k: v.detach() for k, v in model.state_dict().items()}
    keys = list(state)
    sizes = [state[k].numel() * state[k].element_size() for k in keys]
    n = min(n_shards, len(keys))
    which = _split(sizes, n)
    names = [SINGLE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    out = Path(out)
    with atomic_dir(out, force) as tmp:
        (tmp / "config.json").write_text(json.dumps(model.cfg.to_hf_dict(), indent=2) + "\n")
        with _progress(progress) as bar:
            task = bar.add_task("writing weights", total=sum(sizes))
            for i, fname in enumerate(names):
                shard = {k: state[k].cpu().contiguous() for k, w in zip(keys, which) if w == i}
                bar.update(task, description=f"writing {fname}")
                save_file(shard, str(tmp / fname), metadata={"format": "pt"})
                bar.advance(task, sum(s for s, w in zip(sizes, which) if w == i))
        if n > 1:
            index = {"metadata": {"total_size": sum(sizes)},
                     "weight_map": {k: names[w] for k, w in zip(keys, which)}}
            (tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return out


@torch.no_grad()
def convert_model(model: torch.nn.Module, fmt: str = "nvfp4") -> torch.nn.Module:
    """A copy of `model` whose quantized linears are in `fmt` (see FORMATS): each weight in another
    format is dequantized to fp32 and requantized; everything else is copied bit for bit."""
    from dsv4.layers.linear import Linear
    from dsv4.model import Transformer

    if fmt not in FORMATS:
        raise DSV4Error(f"unknown checkpoint format {fmt!r}; choose one of {', '.join(FORMATS)}")
    dense, experts = FORMATS[fmt]
    cfg = model.cfg.replace(weight_fmt=dense, expert_fmt=experts)
    device = next(model.parameters()).device
    with torch.device(device):
        new = Transformer(cfg, device=device)
    src_state = model.state_dict()
    for k, v in new.state_dict().items():
        s = src_state.get(k)
        if s is not None and s.shape == v.shape and s.dtype == v.dtype:
            v.copy_(s)
    src_mods = dict(model.named_modules())
    for name, mod in new.named_modules():
        if isinstance(mod, Linear) and mod.fmt != src_mods[name].fmt:
            mod.load_dense(src_mods[name].dequantized(torch.float32))
    return new.eval()


def make_checkpoint(preset_name: str = "tiny", out: str | Path = "tiny-ckpt", seed: int = 0, fmt: str = "fp8",
                    n_shards: int = 2, force: bool = False, progress: bool = True) -> Path:
    """A seeded synthetic checkpoint: `dsv4.load(preset, seed=seed)`'s weights in the released layout.

    fmt "fp8" is the released format (FP8 dense + FP4 experts) and loads back to the very same
    logits as the preset; "nvfp4" / "bf16" are conversions of those same weights.
    """
    from dsv4.loader import load

    if fmt not in FORMATS:
        raise DSV4Error(f"unknown checkpoint format {fmt!r}; choose one of {', '.join(FORMATS)}")
    out = Path(out)
    if out.is_dir() and any(out.iterdir()) and not force:  # fail before building anything
        raise DSV4Error(f"{out}: already exists and is not empty (pass --force to replace it)")
    model = load(preset_name, device="cpu", seed=seed)
    if fmt != "fp8":
        model = convert_model(model, fmt)
    return save_checkpoint(model, out, n_shards=n_shards, force=force, progress=progress)


def convert_checkpoint(src_dir: str | Path, dst_dir: str | Path, fmt: str = "nvfp4", n_shards: int = 2,
                       force: bool = False, progress: bool = True) -> Path:
    """Checkpoint DIR -> a copy in another weight format (e.g. NVFP4), written atomically."""
    model = load_model(src_dir, device="cpu", progress=progress)
    return save_checkpoint(convert_model(model, fmt), dst_dir, n_shards=n_shards, force=force, progress=progress)
