"""Loads a checkpoint directory in the released DeepSeek-V4 safetensors layout.

Two passes, so nothing half-loaded is ever used: first every shard's header is read and checked
(the file really holds the bytes its header claims; every tensor the model needs is there with
the right shape and dtype; nothing unknown is there), then the tensors are copied one by one
from the memory-mapped shards into the model on its device. A bad checkpoint fails in the first
pass with one DSV4Error line naming the file and the tensor; a failure in the second pass (I/O
error, device out of memory, Ctrl-C) moves the model to the meta device so it cannot be run.

Pickle checkpoints (*.bin, *.pt) are refused, never opened: unpickling runs arbitrary code.
The writer (synthetic checkpoints, NVFP4 conversion) is in dsv4/checkpoint_write.py.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from safetensors import safe_open

from dsv4.config import ModelConfig
from dsv4.errors import DSV4Error
from dsv4.model import Transformer

__all__ = ["load_model", "load_checkpoint", "read_config", "scan", "plan", "expected_specs", "canonical_name",
           "Entry", "DTYPES", "DTYPE_NAMES", "INDEX", "SINGLE"]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
          "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "F8_E8M0": torch.float8_e8m0fnu,
          "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
          "BOOL": torch.bool}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
# HF-style module names some conversion tools write -> the released bare names
RENAMES = {"self_attn": "attn", "mlp": "ffn", "weight_scale_inv": "scale", "e_score_correction_bias": "bias"}
# NVIDIA ModelOpt NVFP4 names (nvidia/DeepSeek-R1-0528-FP4: weight U8, weight_scale F8_E4M3 per 16,
# weight_scale_2 F32 scalar, input_scale F32) -> ours; accepted on nvfp4 layers only
MODELOPT = {"weight_scale": "scale", "weight_scale_2": "global_scale"}
IGNORED_LEAVES = {"input_scale"}  # static activation scales: activations are quantized dynamically here
_MAX_HEADER = 100 << 20


@dataclass(frozen=True)
class Entry:
    """One tensor as a shard's header describes it."""

    file: Path
    key: str  # as stored in the file
    name: str  # the model's name for it (prefix stripped, renames applied)
    dtype: str  # safetensors dtype name
    shape: tuple[int, ...]


def canonical_name(key: str) -> str:
    """`model.`-prefixed / HF-renamed key -> the released bare name (ModelOpt names kept)."""
    if key.startswith("model."):
        key = key[len("model."):]
    return ".".join(RENAMES.get(part, part) for part in key.split("."))


# ------------------------------------------------------------------ config


def read_config(directory: str | Path) -> ModelConfig:
    """DIR/config.json (HF-style as released, or inference-style) -> ModelConfig."""
    directory = _check_dir(directory)
    return ModelConfig.from_file(directory / "config.json")


def _check_dir(directory: str | Path) -> Path:
    directory = Path(directory)
    if not directory.is_dir():
        raise DSV4Error(f"{directory}: not a checkpoint directory")
    return directory


# ------------------------------------------------------------------ pass 1: headers


def _refuse_pickle(path: Path) -> None:
    raise DSV4Error(f"{path}: a pickle checkpoint; refusing to unpickle it (that can run arbitrary code); "
                    f"convert it to safetensors first")


def read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
    """{key: (dtype, shape, begin, end)} after checking the file holds every byte it claims."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            if n is None or n > _MAX_HEADER or 8 + n > size:
                if head[:4] == b"PK\x03\x04" or (head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03",
                                                                                   b"\x04", b"\x05")):
                    _refuse_pickle(path)  # torch.save zip archive or a raw pickle named .safetensors
                raise DSV4Error(f"{path}: truncated shard or not safetensors (header claims "
                                f"{'?' if n is None else n} bytes, the file has {size})")
            raw = f.read(n)
    except FileNotFoundError:
        raise DSV4Error(f"{path}: shard missing") from None
    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DSV4Error(f"{path}: corrupt safetensors header ({e})") from None
    out, data = {}, size - 8 - n
    for key, info in meta.items():
        if key == "__metadata__":
            continue
        dtype, shape, (b, e) = info.get("dtype"), tuple(info.get("shape", ())), info.get("data_offsets", (0, 0))
        if dtype not in DTYPES:
            raise DSV4Error(f"{path}: tensor {key} has unsupported dtype {dtype}")
        if e > data:
            raise DSV4Error(f"{path}: truncated shard: tensor {key} needs bytes up to {8 + n + e}, "
                            f"the file has {size}")
        if e - b != math.prod(shape) * DTYPES[dtype].itemsize or b > e:
            raise DSV4Error(f"{path}: corrupt header: tensor {key} {dtype} {list(shape)} spans {e - b} bytes")
        out[key] = (dtype, shape, b, e)
    return out


def _index(directory: Path) -> dict[str, str] | None:
    """The index's weight_map {key: shard file name}, or None for an unindexed checkpoint."""
    index = directory / INDEX
    if not index.exists():
        return None
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise DSV4Error(f"{index}: not a valid index ({e.__class__.__name__}: {e})") from None
    return weight_map


def _shard_files(directory: Path, weight_map: dict[str, str] | None) -> list[Path]:
    if weight_map is not None:
        files = sorted(set(weight_map.values()))
        for name in files:
            if name.endswith(PICKLE_SUFFIXES):
                _refuse_pickle(directory / name)
            if Path(name).name != name:
                raise DSV4Error(f"{directory / INDEX}: shard name {name!r} points outside the checkpoint directory")
            if not (directory / name).is_file():
                key = next(k for k, v in weight_map.items() if v == name)
                raise DSV4Error(f"{directory / name}: shard missing (listed in {INDEX} for {key} and others)")
        return [directory / name for name in files]
    if (directory / SINGLE).exists():
        return [directory / SINGLE]
    found = sorted(directory.glob("*.safetensors"))
    if found:
        return found
    pickles = sorted(p for p in directory.iterdir() if p.name.endswith(PICKLE_SUFFIXES + (".bin.index.json",)))
    if pickles:
        _refuse_pickle(pickles[0])
    raise DSV4Error(f"{directory}: no safetensors weights ({INDEX} or {SINGLE})")


def scan(directory: str | Path) -> dict[str, Entry]:
    """Every tensor of the checkpoint by its canonical name, from the headers only (no data read)."""
    directory = _check_dir(directory)
    weight_map = _index(directory)
    entries: dict[str, Entry] = {}
    for path in _shard_files(directory, weight_map):
        for key, (dtype, shape, _, _) in read_header(path).items():
            name = canonical_name(key)
            if name in entries:
                raise DSV4Error(f"{path}: tensor {key} duplicates {entries[name].key} in {entries[name].file.name}")
            entries[name] = Entry(path, key, name, dtype, shape)
    if weight_map is not None:
        stored = {(e.file.name, e.key) for e in entries.values()}
        for key, fname in weight_map.items():
            if (fname, key) not in stored:
                raise DSV4Error(f"{directory / fname}: has no tensor {key} although {INDEX} lists it there")
    return entries


# ------------------------------------------------------------------ pass 1: against the model


def expected_specs(model_or_cfg) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Name -> (shape, dtype) of every tensor the model stores (a config is built on `meta`)."""
    if isinstance(model_or_cfg, ModelConfig):
        with torch.device("meta"):
            model_or_cfg = Transformer(model_or_cfg, device="meta")
    return {k: (tuple(v.shape), v.dtype) for k, v in model_or_cfg.state_dict().items()}


def _resolve(entry: Entry, specs: dict) -> str | None:
    """The model name an entry fills; ModelOpt names only where the model has that NVFP4 tensor."""
    if entry.name in specs:
        return entry.name
    stem, _, leaf = entry.name.rpartition(".")
    alias = f"{stem}.{MODELOPT[leaf]}" if leaf in MODELOPT else None
    if alias in specs and (f"{stem}.global_scale" in specs):
        return alias
    return None


def _compatible(stored: str, want: torch.dtype) -> bool:
    return DTYPES[stored] == want or (stored == "U8" and want == torch.int8)  # ModelOpt packs FP4 as U8


def _shared_mtp(name: str) -> bool:
    """An MTP layer's own copy of the embedding or head, which some releases ship: MTP shares the
    main model's (the released convert.py drops these names the same way)."""
    return name.startswith("mtp.") and (".emb." in name or name.endswith("head.weight"))


def plan(entries: dict[str, Entry], specs: dict, directory: Path) -> list[tuple[str, Entry]]:
    """Checks every tensor against the model; returns (model name, entry) pairs to load.

    MTP tensors are accepted and skipped when the model has no MTP layer, an MTP layer's copies of the
    shared embedding and head always; ModelOpt input scales are skipped. Anything else unknown, missing, misshaped or of the wrong dtype is an error.
    """
    has_mtp = any(k.startswith("mtp.") for k in specs)
    todo: dict[str, Entry] = {}
    problems: list[str] = []
    for entry in entries.values():
        target = _resolve(entry, specs)
        leaf = entry.name.rpartition(".")[2]
        if target is None:
            if (entry.name.startswith("mtp.") and not has_mtp) or _shared_mtp(entry.name) or leaf in IGNORED_LEAVES:
                continue
            problems.append(f"{entry.file}: unexpected tensor {entry.key} (not in the model this config.json "
                            f"describes)")
            continue
        if target in todo:
            problems.append(f"{entry.file}: tensor {entry.key} duplicates {todo[target].key}")
            continue
        todo[target] = entry
    missing = [k for k in specs if k not in todo]
    if missing:
        shape, dtype = specs[missing[0]]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        where = directory / INDEX if (directory / INDEX).exists() else directory
        problems.insert(0, f"{where}: missing tensor {missing[0]} ({DTYPE_NAMES.get(dtype, dtype)} "
                           f"{list(shape)}){more}")
    for name, entry in todo.items():
        shape, dtype = specs[name]
        if entry.shape != shape:
            problems.append(f"{entry.file}: tensor {entry.key} has shape {list(entry.shape)}, the config needs "
                            f"{list(shape)}")
        elif not _compatible(entry.dtype, dtype):
            problems.append(f"{entry.file}: tensor {entry.key} is {entry.dtype}, expected "
                            f"{DTYPE_NAMES.get(dtype, dtype)}")
    e8m0 = next((e for e in todo.values() if e.dtype == "F8_E8M0"), None)
    if e8m0 is not None and not _e8m0_supported():
        import safetensors

        problems.append(f"{e8m0.file}: tensor {e8m0.key} is F8_E8M0, which safetensors {safetensors.__version__} "
                        f"cannot read; upgrade safetensors (0.8 works)")
    if problems:
        more = f" (+{len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise DSV4Error(problems[0] + more)
    return sorted(todo.items(), key=lambda kv: (str(kv[1].file), kv[1].key))


# ------------------------------------------------------------------ pass 2: copy


@functools.cache
def _e8m0_supported() -> bool:
    """Older safetensors (0.5.x) cannot read F8_E8M0, the released scale dtype."""
    import tempfile

    from safetensors.torch import save_file

    t = torch.ones(1).to(torch.float8_e8m0fnu)
    try:  # through safe_open, the path loading takes (safetensors.torch.load() lacks E8M0 even in 0.8)
        with tempfile.TemporaryDirectory() as d:
            save_file({"t": t}, f"{d}/t.safetensors")
            with safe_open(f"{d}/t.safetensors", framework="pt") as f:
                return torch.equal(f.get_tensor("t").view(torch.uint8), t.view(torch.uint8))
    except Exception:  # noqa: BLE001 - any failure means "not supported"
        return False


def _progress(enabled: bool) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeRemainingColumn(), console=Console(stderr=True), transient=True, disable=not enabled)


@torch.no_grad()
def _copy(model: torch.nn.Module, todo: list[tuple[str, Entry]], progress: bool) -> None:
    state = model.state_dict(keep_vars=True)
    total = sum(math.prod(e.shape) * DTYPES[e.dtype].itemsize for _, e in todo)
    by_file: dict[Path, list[tuple[str, Entry]]] = {}
    for name, entry in todo:
        by_file.setdefault(entry.file, []).append((name, entry))
    with _progress(progress) as bar:
        task = bar.add_task("loading weights", total=total)
        for path, items in by_file.items():
            bar.update(task, description=f"loading {path.name}")
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name, entry in items:
                    t = f.get_tensor(entry.key)
                    dst = state[name]
                    if t.dtype != dst.dtype:  # only U8 -> I8 (ModelOpt packed FP4) gets here
                        t = t.view(dst.dtype)
                    dst.copy_(t)
                    bar.advance(task, t.numel() * t.element_size())


def load_checkpoint(model: torch.nn.Module, directory: str | Path, progress: bool = True) -> torch.nn.Module:
    """Fills `model` (already on its device) from DIR, after checking every header against it.

    If copying fails midway the model is moved to the meta device (its storage freed) and the
    error re-raised, so a half-loaded model can never run.
    """
    directory = _check_dir(directory)
    todo = plan(scan(directory), expected_specs(model), directory)
    try:
        _copy(model, todo, progress)
    except BaseException:
        model.to("meta")
        raise
    return model


def load_model(directory: str | Path, device="cpu", dtype: str = "bfloat16", progress: bool = True,
               **runtime) -> torch.nn.Module:
    """DIR -> a ready Transformer on `device` (what `dsv4.load(DIR)` returns).

    The config comes from DIR/config.json plus the runtime choices (`dtype`, `max_seq_len`, ...).
    A checkpoint shipped without its MTP layer loads as a model without one (MTP is optional for
    decoding). Everything is validated on a meta-device model before any device memory is used.
    """
    directory = _check_dir(directory)
    cfg = read_config(directory).replace(dtype=dtype, **runtime)
    entries = scan(directory)
    if cfg.n_mtp_layers and not any(n.startswith("mtp.") for n in entries):
        cfg = cfg.replace(n_mtp_layers=0)
    todo = plan(entries, expected_specs(cfg), directory)
    device = torch.device(device)
    with torch.device(device):
        model = Transformer(cfg, device=device)
    _copy(model, todo, progress)  # on failure the model is simply never returned
    return model.eval()
