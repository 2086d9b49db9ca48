"""Which source files are whose: what a finding may point at, and whose frames are recorded.

Three kinds of frame:
- hidden: torch itself, the audit, the stdlib, numpy's array-protocol layer (and `<string>`-like code): never a
  finding's site;
- library: code outside torch that the target calls into (transformers, a serving engine, any
  installed package, a helper module elsewhere): a finding's site is its innermost such frame. So is the
  model-building library torch ships inside itself, `torch.ao` (observers, fake quantization, QAT and quantized
  modules a user puts into a model, whose `forward` reads flags and qparams back on every call), except its
  modules that define ops (`quantized_decomposed`, a `torch.library.Library` at module level): an op's kernel
  is the op's inside, reported at the op's call;
- own: the target's own files (the folder of its FILE.py, the package of its pkg.module, the
  model package dsv4): the frame there that led to the site is the finding's caller.

`is_user_file` is the older, broader notion (not torch, the audit, the stdlib or site-packages:
source a person would edit) and still picks which modules' globals count as state.
"""

from __future__ import annotations

import contextlib
import functools
import os
import site
import sysconfig

import torch

from audit.scan.sources import loaded

__all__ = ["HIDDEN", "LIBRARY", "OWN", "display_path", "frame_kind", "is_import_root", "is_user_file", "norm_dir",
           "norm_root", "real_path"]

HIDDEN, LIBRARY, OWN = 0, 1, 2

# A scan resolves the same few thousand source files (every imported module's) on each lookup; a file's
# resolved path does not change while the process runs.
real_path = functools.lru_cache(maxsize=1 << 16)(os.path.realpath)
_TORCH_ROOT = os.path.join(os.path.realpath(os.path.dirname(torch.__file__)), "")


def norm_dir(p: str) -> str:
    return os.path.join(os.path.realpath(p), "")


def norm_root(p: str) -> str:
    """A folder (ends with the separator) or a single file: what counts as the target's own code."""
    r = os.path.realpath(p)
    return r if os.path.isfile(r) else os.path.join(r, "")


# torch's subpackages that are libraries a model is built from, not torch's machinery (see the docstring)
TORCH_LIBRARIES = ("ao",)


def _torch_library_dirs() -> list[str]:
    base = os.path.dirname(torch.__file__)
    return [norm_dir(os.path.join(base, p)) for p in TORCH_LIBRARIES]


_OP_MODULES: dict[str, bool] = {}


def _defines_ops(f: str) -> bool:
    """Whether the loaded module of file `f` holds a `torch.library.Library` at module level (its functions are
    the kernels of the ops it defines). Unknown until the module is loaded (then False, not remembered)."""
    if f in _OP_MODULES:
        return _OP_MODULES[f]
    lib_type = getattr(getattr(torch, "library", None), "Library", None)
    for _, mod, file in loaded.with_files():
        if real_path(file) == f:
            found = lib_type is not None and any(isinstance(v, lib_type) for v in list(vars(mod).values()))
            _OP_MODULES[f] = found
            return found
    return False


def _site_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("purelib", "platlib") if k in paths}
    with contextlib.suppress(Exception):
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    return sorted({norm_dir(d) for d in dirs if d})


def _hidden_dirs() -> list[str]:
    import audit

    dirs = {os.path.dirname(torch.__file__), os.path.dirname(audit.__file__)}
    for name in ("functorch", "torchgen"):  # torch's own companions
        with contextlib.suppress(Exception):
            import importlib.util

            spec = importlib.util.find_spec(name)
            if spec and spec.origin:
                dirs.add(os.path.dirname(spec.origin))
    # numpy's Python layer (np.cumsum(t) -> fromnumeric._wrapit -> t.__array__()) only forwards the array
    # protocol to torch: the hazard lives in the line that handed numpy the tensor, never in numpy
    with contextlib.suppress(Exception):
        import importlib.util

        spec = importlib.util.find_spec("numpy")
        if spec and spec.origin:
            dirs.add(os.path.dirname(spec.origin))
    # typing_extensions, the stdlib typing's backport (one file): its `deprecated` wrapper around torch functions
    # (`torch.testing.assert_allclose`, `dist.reduce_scatter_tensor`) only forwards the call, as the stdlib would
    files = set()
    with contextlib.suppress(Exception):
        import importlib.util

        spec = importlib.util.find_spec("typing_extensions")
        if spec and spec.origin:
            files.add(os.path.realpath(spec.origin))
    # the auditor's own command line (`cli.py` beside the audit package): its progress display is no target state
    cli = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(audit.__file__))), "cli.py")
    if os.path.isfile(cli):
        files.add(cli)
    return sorted({norm_dir(d) for d in dirs} | files)


def _stdlib_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    return sorted({norm_dir(paths[k]) for k in ("stdlib", "platstdlib") if k in paths})


def _skip_dirs() -> list[str]:
    return sorted(set(_hidden_dirs()) | set(_site_dirs()) | set(_stdlib_dirs()))


def _user_dirs() -> list[str]:
    """Always the project's own code even if installed into site-packages: the model package."""
    import importlib.util

    spec = importlib.util.find_spec("dsv4")
    return [norm_dir(os.path.dirname(spec.origin))] if spec and spec.origin else []


_SKIP: list[str] | None = None
_KEEP: list[str] | None = None
_HIDDEN: list[str] | None = None
_SITE: list[str] | None = None
_STDLIB: list[str] | None = None
_TORCH_LIB: list[str] | None = None


def _init() -> None:
    global _SKIP, _KEEP, _HIDDEN, _SITE, _STDLIB, _TORCH_LIB
    if _SKIP is None:
        _HIDDEN, _SITE, _STDLIB, _KEEP = _hidden_dirs(), _site_dirs(), _stdlib_dirs(), _user_dirs()
        _TORCH_LIB = _torch_library_dirs()
        _SKIP = _skip_dirs()


def _under(f: str, roots) -> bool:
    return any(f == r or (r.endswith(os.sep) and f.startswith(r)) for r in roots)


def is_user_file(filename: str, extra: tuple[str, ...] = ()) -> bool:
    """True for source a person would edit: not torch, the audit, the stdlib or site-packages."""
    _init()
    if not filename or (filename.startswith("<") and not filename.startswith("<ipython-input")):
        return False
    f = real_path(filename)
    if any(f.startswith(d) for d in _KEEP) or _under(f, extra):
        return True
    return not any(f.startswith(d) for d in _SKIP)


def is_torch_file(filename: str) -> bool:
    """Whether a frame's file is torch's own Python (by where torch is installed, not by a path's words)."""
    return bool(filename) and not filename.startswith("<") and real_path(filename).startswith(_TORCH_ROOT)


def frame_kind(filename: str, roots: tuple[str, ...] = ()) -> int:
    """HIDDEN, LIBRARY or OWN for a frame's file (roots: the target's own folders or files, normalized)."""
    _init()
    if not filename or (filename.startswith("<") and not filename.startswith("<ipython-input")):
        return HIDDEN
    f = real_path(filename)
    if any(f.startswith(d) for d in _TORCH_LIB) and not _defines_ops(f):
        return LIBRARY
    if any(f.startswith(d) for d in _HIDDEN):
        return HIDDEN
    if any(f.startswith(d) for d in _KEEP) or _under(f, roots):
        return OWN
    if any(f.startswith(d) for d in _SITE):
        return LIBRARY
    if any(f.startswith(d) for d in _STDLIB):
        return HIDDEN
    return LIBRARY


def display_path(filename: str, cwd: str, skip: tuple[str, ...] = ()) -> str:
    """What a person opens: relative to the working directory when inside it; code imported from an
    installed location (site-packages, a folder on sys.path) as its package path
    (`transformers/models/llama/modeling_llama.py`, the file Python actually ran); else absolute.
    skip: folders that do not count as install locations (a target file's own folder)."""
    if not filename or filename.startswith("<"):
        return filename
    f = real_path(filename)
    if f.startswith(cwd + os.sep):
        return os.path.relpath(f, cwd)
    for root in _import_roots():
        if root not in skip and f.startswith(root):
            return os.path.relpath(f, root)
    return _package_path(f, skip) or filename


def _package_path(f: str, skip: tuple[str, ...]) -> str | None:
    """A file of a package imported through an import hook rather than a folder on sys.path (an editable
    install, `pip install -e`): its path inside that package (`stepkit/caches.py`), from the module
    Python loaded it as, where an import finder resolves the package's name to the same folder (a
    target file loaded under a private name is not found by any finder and keeps its full path)."""
    import sys

    for name in _names_by_file().get(f, ()):
        top = name.partition(".")[0]
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            try:
                spec = find(top, None) if find else None
            except Exception:  # a third-party finder that fails on a name it does not serve
                spec = None
            if spec is None or not spec.origin:
                continue
            root = os.path.dirname(os.path.realpath(spec.origin))
            if spec.submodule_search_locations is not None:  # a package: paths start with its folder's name
                root = os.path.dirname(root)
            if norm_dir(root) not in skip and f.startswith(root + os.sep):
                return os.path.relpath(f, root)
            break
    return None


def _names_by_file() -> dict:
    """Real path -> the names it is loaded under, in load order (rebuilt when the loaded modules change)."""
    def build(_pairs):
        out: dict = {}
        for name, _, file in loaded.with_files():
            out.setdefault(real_path(file), []).append(name)
        return out
    return loaded.until_changed("user_code.names_by_file", build)


def is_import_root(folder: str) -> bool:
    """A folder code is installed into (site-packages, the stdlib): not one package's own folder."""
    _init()
    d = norm_dir(folder)
    return d in _SITE or d in _STDLIB


def _import_roots() -> list[str]:
    """Folders code is imported from, deepest first (a package inside another root wins)."""
    import sys

    _init()
    roots = set(_SITE)
    for p in sys.path:
        if p and os.path.isdir(p):
            roots.add(norm_dir(p))
    roots -= set(_STDLIB)  # the stdlib never hosts a finding
    return sorted(roots, key=len, reverse=True)
