"""Helpers shared by the checkpoint tests: fresh seeds, the CLI, headers, bitwise state compare, and
rewriting a checkpoint with other key names / shard counts using plain safetensors (not our writer)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import cli
from dsv4.checkpoint import INDEX

SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def fresh_seed() -> int:
    """Seeds torch's global generator from the OS (it starts at a fixed seed otherwise); printed
    so a failure can be replayed."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"torch seed {seed}")
    torch.manual_seed(seed)
    return seed


def make_tiny(directory: Path, seed: int | None = None) -> tuple[Path, int]:
    """`dsv4-audit make-checkpoint --preset tiny` into directory/tiny with a fresh seed."""
    seed = random.randrange(1 << 30) if seed is None else seed
    print(f"checkpoint seed {seed}")
    out = directory / "tiny"
    r = cli_run("make-checkpoint", "--preset", "tiny", "--out", str(out), "--seed", str(seed))
    assert r.exit_code == 0, r.output
    return out, seed


def cli_run(name: str, *args: str):
    """Invokes a command of the real app (a lone command is the app itself in typer)."""
    from typer.main import get_command

    argv = [name, *args] if hasattr(get_command(cli.app), "commands") else list(args)
    return CliRunner().invoke(cli.app, argv)


def header(path: Path) -> dict:
    with safe_open(str(path), "pt") as f:
        return {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}


def state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def bitwise_equal(a: dict, b: dict) -> bool:
    """Same names, dtypes and bytes (NaN-safe, -0 != +0)."""
    def raw(t):
        return t.reshape(-1).view(torch.uint8)

    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(raw(a[k]), raw(b[k])) for k in a)


def rewrite(src: Path, dst: Path, rename=lambda k, t: {k: t}, n_shards: int = 2, prefix: str = "",
            config=None) -> Path:
    """Copy of a checkpoint with keys/tensors mapped by `rename` (k, t) -> {k': t'}, written with
    plain safetensors (not our writer) into n_shards files (1 = model.safetensors, no index)."""
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(src.glob("*.safetensors")):
        for k, t in load_file(str(f)).items():
            tensors.update(rename(prefix + k, t))
    dst.mkdir(parents=True)
    raw = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(config(raw) if config else raw))
    keys = list(tensors)
    if n_shards == 1:
        save_file(tensors, str(dst / "model.safetensors"))
        return dst
    names = [f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors" for i in range(n_shards)]
    wm = {k: names[i * n_shards // len(keys)] for i, k in enumerate(keys)}
    for name in names:
        save_file({k: tensors[k] for k in keys if wm[k] == name}, str(dst / name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (dst / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wm}))
    return dst
