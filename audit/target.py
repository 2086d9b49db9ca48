"""The AuditTarget protocol and how a target is found: a factory, `file.py:factory`, `pkg.module:factory`
(installed code), `hf:DIR` (a local transformers model, audit/target_hf.py) or `dsv4:<preset>`.

A target is a factory `make(device) -> obj`. `obj.prepare(i)` stages step i's inputs on the host
side (what runs outside a graph: not audited); `obj.step()` is the region that would be captured
and replayed every decode step (audited). Everything that can go wrong while finding or building
a target is an AuditError with one line that says what to fix.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from audit.errors import AuditError

__all__ = ["PATHS", "AuditTarget", "Dsv4Reference", "Dsv4Static", "Resolved", "resolve"]

PATHS = ("reference", "static")


@runtime_checkable
class AuditTarget(Protocol):
    def prepare(self, i: int) -> None: ...

    def step(self) -> Any: ...


@dataclass
class Resolved:
    obj: Any
    name: str                  # short name for output folders: "tiny", "planted_host_sync-make"
    label: str                 # what the report calls it: "dsv4:tiny (reference path)"
    roots: tuple[str, ...] = ()  # folders (or files) that are the target's own code: a finding's caller


# ---------------------------------------------------------------------- built-in: DeepSeek-V4
def _load_dsv4(preset: str, device: str, seed: int, tp: int):
    """The seeded model; with tp > 1 this rank's shard of it (the process group must be up: every
    rank loads the same seed, so the shards fit together)."""
    import dsv4

    model = dsv4.load(preset, device=device, dtype="bfloat16", seed=seed)
    if tp > 1:
        import torch.distributed as dist

        from dsv4.decode.parallel import shard_

        if not dist.is_initialized() or dist.get_world_size() != tp:
            raise AuditError(f"tp={tp} needs a process group of {tp} ranks: launch with torchrun --nproc-per-node {tp}")
        shard_(model, dist.get_rank(), tp)
    return model


class Dsv4Reference:
    """The eager reference decode: prefill a short random prompt, then decode one token per step."""

    def __init__(self, preset: str, device: str, batch: int = 1, prompt_len: int = 8, seed: int = 0, tp: int = 1):
        self.device = torch.device(device)
        self.model = _load_dsv4(preset, device, seed, tp)
        self.vocab = self.model.cfg.vocab_size
        self.batch = batch
        self.gen = torch.Generator().manual_seed(seed)
        prompt = torch.randint(0, self.vocab, (batch, prompt_len), generator=self.gen)
        self.model.prefill(prompt.to(self.device))
        self.ids = None

    def prepare(self, i: int) -> None:
        """Next token ids, staged the way an eager loop does it: a fresh tensor each step."""
        self.ids = torch.randint(0, self.vocab, (self.batch,), generator=self.gen).to(self.device)

    def step(self):
        return self.model.decode(self.ids)


class Dsv4Static(Dsv4Reference):
    """The graph-ready decode (dsv4.decode.static.StaticDecoder): static buffers, device positions."""

    def __init__(self, preset: str, device: str, batch: int = 1, prompt_len: int = 8, seed: int = 0, tp: int = 1):
        try:
            from dsv4.decode.static import StaticDecoder
        except ImportError as e:
            raise AuditError(f"the static decode path is not available ({e}); "
                             "dsv4.decode.static.StaticDecoder is needed for --path static") from None
        self.device = torch.device(device)
        self.model = _load_dsv4(preset, device, seed, tp)  # sharded before the decoder stacks its expert banks
        self.vocab, self.batch = self.model.cfg.vocab_size, batch
        self.gen = torch.Generator().manual_seed(seed)
        self.dec = StaticDecoder(self.model, batch_size=batch)
        prompt = torch.randint(0, self.vocab, (batch, prompt_len), generator=self.gen)
        self.dec.prefill(prompt.to(self.device))

    def prepare(self, i: int) -> None:
        self.dec.stage(torch.randint(0, self.vocab, (self.batch,), generator=self.gen).to(self.device))

    def step(self):
        return self.dec.step()


def _dsv4(preset: str, path: str, tp: int = 1, options: dict | None = None) -> Callable[[str], Any]:
    cls = Dsv4Reference if path == "reference" else Dsv4Static
    kw = {k: v for k, v in (options or {}).items() if k in ("batch", "prompt_len", "seed") and v is not None}
    return lambda device: cls(preset, device, tp=tp, **kw)


# ---------------------------------------------------------------------- resolution
def _user_frame(exc: BaseException) -> str:
    """' (at file:line)' for the innermost traceback frame outside torch and the audit."""
    from audit.scan.sources.user_code import is_user_file

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if is_user_file(f.filename)]
    if not frames:
        return ""
    f = frames[-1]
    name = os.path.relpath(f.filename) if not os.path.relpath(f.filename).startswith("..") else f.filename
    return f" (at {name}:{f.lineno})"


def describe_error(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}{': ' + msg if msg else ''}{_user_frame(exc)}"


TARGET_PREFIX = "_audit_target_"  # the name of a target module loaded from its file


def _load_file(spec: str) -> tuple[Callable, str, str, tuple[str, ...]]:
    file, _, factory = spec.rpartition(":")
    if not file or not factory:
        raise AuditError(f"--target {spec!r}: expected FILE.py:FACTORY, pkg.module:FACTORY, hf:DIR or dsv4:<preset>")
    p = Path(file)
    if p.is_dir():
        raise AuditError(f"--target {spec!r}: {file} is a directory; name the .py file that defines {factory!r}")
    if not p.is_file():
        raise AuditError(f"--target {spec!r}: no such file {file}")
    if p.suffix != ".py":
        raise AuditError(f"--target {spec!r}: {file} is not a .py file")
    mod_name = f"{TARGET_PREFIX}{p.stem}_{abs(hash(str(p.resolve()))) % 10**8}"
    try:
        spec_obj = importlib.util.spec_from_file_location(mod_name, p)
        module = importlib.util.module_from_spec(spec_obj)
        sys.modules[mod_name] = module
        folder = str(p.resolve().parent)
        if folder not in sys.path:  # its sibling modules import as under `python file.py`
            sys.path.insert(0, folder)
        spec_obj.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - whatever the file raises on import is the user's one-line error
        sys.modules.pop(mod_name, None)
        raise AuditError(f"--target {spec!r}: importing {file} raised {describe_error(e)}") from None
    fn = getattr(module, factory, None)
    if fn is None:
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == mod_name)
        hint = f" (callables there: {', '.join(found)})" if found else ""
        raise AuditError(f"--target {spec!r}: {file} has no factory {factory!r}{hint}")
    if not callable(fn):
        raise AuditError(f"--target {spec!r}: {factory!r} in {file} is not callable")
    return fn, f"{p.stem}-{factory}", f"{file}:{factory}", (str(p.resolve().parent),)


_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def is_module_spec(spec: str) -> bool:
    """'pkg.module:factory' (an importable name), as opposed to 'path/file.py:factory'."""
    mod, _, factory = spec.rpartition(":")
    return (bool(_MODULE.fullmatch(mod)) and bool(factory) and not mod.endswith(".py")
            and not Path(mod).exists())


def _file_root(f: str) -> tuple[str, ...]:
    """A source file's own-code root: its folder, or the file alone when that folder is an install
    location (site-packages); nothing for torch, the audit or the stdlib."""
    from audit.scan.sources.user_code import HIDDEN, frame_kind, is_import_root

    if not f or frame_kind(f) == HIDDEN:
        return ()
    folder = str(Path(f).resolve().parent)
    return (str(Path(f).resolve()),) if is_import_root(folder) else (folder,)


def _code_roots(obj) -> tuple[str, ...]:
    """The folder of the file that defines a factory (or a built target's class): its own code."""
    fn = getattr(obj, "__func__", obj)
    with_file = fn if inspect.isfunction(fn) or inspect.isclass(fn) or inspect.ismethod(fn) else type(obj)
    try:
        f = inspect.getsourcefile(with_file)
    except (TypeError, OSError):
        return ()
    return _file_root(f) if f else ()


def _module_roots(module) -> tuple[str, ...]:
    """The installed package a module belongs to (its top-level folder), or the module file alone."""
    top = sys.modules.get(module.__name__.partition(".")[0])
    f = getattr(top, "__file__", None)
    if top is not None and getattr(top, "__path__", None) is not None and f:
        return (str(Path(f).resolve().parent),)
    f = getattr(module, "__file__", None)
    return (str(Path(f).resolve()),) if f else ()


def _load_module(spec: str) -> tuple[Callable, str, str, tuple[str, ...]]:
    """'pkg.module:factory' from installed code (site-packages, or anything importable)."""
    mod_name, _, factory = spec.rpartition(":")
    try:
        found = importlib.util.find_spec(mod_name)
    except (ImportError, ValueError, AttributeError):
        found = None
    except Exception as e:  # noqa: BLE001 - a parent package that raises on import
        raise AuditError(f"--target {spec!r}: importing {mod_name} raised {describe_error(e)}") from None
    if found is None:
        raise AuditError(f"--target {spec!r}: no module named {mod_name!r} is installed "
                         "(for a source file give FILE.py:FACTORY)")
    try:
        module = importlib.import_module(mod_name)
    except (Exception, SystemExit) as e:  # noqa: BLE001
        raise AuditError(f"--target {spec!r}: importing {mod_name} raised {describe_error(e)}") from None
    fn = getattr(module, factory, None)
    if fn is None:
        raise AuditError(f"--target {spec!r}: module {mod_name} has no factory {factory!r}")
    if not callable(fn):
        raise AuditError(f"--target {spec!r}: {factory!r} in {mod_name} is not callable")
    return fn, f"{mod_name}-{factory}", spec, _module_roots(module)


def _hf(spec: str, options: dict) -> tuple[Callable, str, str]:
    from audit.target_hf import hf_target

    where = spec[3:]
    factory = hf_target(spec, where, options)
    cache = options.get("cache") or "dynamic"
    name = f"hf-{Path(where.rstrip('/')).name or 'model'}-{cache}"
    if Path(where).name == "config.json":
        name = f"hf-{Path(where).resolve().parent.name}-{cache}"
    name += _option_suffix(options)
    return factory, name, f"{spec} ({cache} cache)"


def _option_suffix(options: dict) -> str:
    """'-b2-p4' for --batch 2 --prompt-len 4: a scan with other shapes gets its own output folder."""
    return "".join(f"-{tag}{options[k]}" for k, tag in (("batch", "b"), ("prompt_len", "p"))
                   if options.get(k) is not None)


def _check_options(target, options: dict) -> None:
    """--cache belongs to hf: targets; --batch / --prompt-len to hf: and dsv4: targets."""
    given = {k for k, v in options.items() if v is not None and k in ("cache", "batch", "prompt_len")}
    is_hf = isinstance(target, str) and target.startswith("hf:")
    is_dsv4 = isinstance(target, str) and target.startswith("dsv4:")
    if "cache" in given and not is_hf:
        raise AuditError("--cache applies to hf:DIR targets (dsv4 targets pick theirs with --path)")
    if given - {"cache"} and not (is_hf or is_dsv4):
        raise AuditError("--batch and --prompt-len apply to hf:DIR and dsv4:<preset> targets; "
                         "a factory target sets its own")


def resolve(target, device: str, path: str = "reference", tp: int = 1, options: dict | None = None) -> Resolved:
    """Builds the target object; every failure is an AuditError naming the target.

    target: a factory `make(device)`, 'file.py:factory', 'pkg.module:factory', 'hf:DIR',
    'dsv4:<preset>', or an object that already has prepare(i) and step(). tp > 1 shards a
    dsv4:<preset> model over the ranks of the default process group (other targets shard
    themselves, if at all). options: cache / batch / prompt_len (hf: and dsv4: targets), seed,
    max_new_tokens (how many steps an hf: StaticCache must hold)."""
    options = dict(options or {})
    if path not in PATHS:
        raise AuditError(f"--path must be one of {', '.join(PATHS)}, not {path!r}")
    if tp > 1 and not (isinstance(target, str) and target.startswith("dsv4:")):
        raise AuditError(f"--tp {tp} shards dsv4:<preset> targets; a FILE.py:FACTORY target under torchrun is "
                         "scanned per rank as it is (leave --tp out)")
    _check_options(target, options)
    roots: tuple[str, ...] = ()
    if not isinstance(target, (str, type)) and callable(getattr(target, "step", None)) \
            and callable(getattr(target, "prepare", None)):  # already a built target object
        return Resolved(target, type(target).__name__, type(target).__name__, _code_roots(type(target)))
    if callable(target) and not isinstance(target, str):
        factory = target
        name = getattr(target, "__name__", type(target).__name__)
        label = f"{getattr(target, '__module__', '?')}.{name}"
        roots = _code_roots(target)
    elif isinstance(target, str) and target.startswith("dsv4:"):
        preset = target[5:]
        from dsv4.config import PRESETS

        if preset not in PRESETS:
            raise AuditError(f"--target {target!r}: unknown preset {preset!r} (choose one of {', '.join(PRESETS)})")
        factory, name, label = _dsv4(preset, path, tp, options), f"{preset}-{path}", f"dsv4:{preset} ({path} path)"
        name += _option_suffix(options)
        if tp > 1:
            name, label = f"{name}-tp{tp}", f"dsv4:{preset} ({path} path, tensor parallel over {tp} ranks)"
    elif isinstance(target, str) and target.startswith("hf:"):
        factory, name, label = _hf(target, options)
    elif isinstance(target, str) and is_module_spec(target):
        factory, name, label, roots = _load_module(target)
    elif isinstance(target, str):
        factory, name, label, roots = _load_file(target)
    else:
        raise AuditError(f"target must be a factory, 'FILE.py:FACTORY', 'pkg.module:FACTORY', 'hf:DIR' or "
                         f"'dsv4:<preset>', not {type(target).__name__}")
    try:
        obj = factory(device)
    except AuditError:
        raise
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a factory may raise anything; report it as one line
        raise AuditError(f"target {label}: the factory raised {describe_error(e)}") from None
    missing = [m for m in ("prepare", "step") if not callable(getattr(obj, m, None))]
    if missing:
        raise AuditError(f"target {label}: the factory returned a {type(obj).__name__} without "
                         f"{' and '.join(m + '()' for m in missing)} (an AuditTarget needs prepare(i) and step())")
    if isinstance(target, str) and target.startswith("hf:"):  # the architecture's folder (models/llama/) is the
        roots = _code_roots(type(obj.model))  # model's own code: the caller of a cache or mask utility's finding
    return Resolved(obj, name, label, roots)
