"""Which source files are user code: what a finding may point at, and whose frames are recorded.

Not torch, not the audit itself, not the stdlib or site-packages; the model package (dsv4) always
counts, even when installed into site-packages.
"""

from __future__ import annotations

import contextlib
import os
import site
import sysconfig

import torch

__all__ = ["is_user_file", "norm_dir"]


def norm_dir(p: str) -> str:
    return os.path.join(os.path.realpath(p), "")


def _skip_dirs() -> list[str]:
    import audit

    dirs = {os.path.dirname(torch.__file__), os.path.dirname(audit.__file__)}
    paths = sysconfig.get_paths()
    dirs.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths)
    with contextlib.suppress(Exception):
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    return sorted({norm_dir(d) for d in dirs if d})


def _user_dirs() -> list[str]:
    """Always user code even if installed into site-packages: the model package."""
    import importlib.util

    spec = importlib.util.find_spec("dsv4")
    return [norm_dir(os.path.dirname(spec.origin))] if spec and spec.origin else []


_SKIP: list[str] | None = None
_KEEP: list[str] | None = None


def is_user_file(filename: str, extra: tuple[str, ...] = ()) -> bool:
    """True for source a person would edit: not torch, the audit, the stdlib or site-packages."""
    global _SKIP, _KEEP
    if _SKIP is None:
        _SKIP, _KEEP = _skip_dirs(), _user_dirs()
    if not filename or (filename.startswith("<") and not filename.startswith("<ipython-input")):
        return False
    f = os.path.realpath(filename)
    if any(f.startswith(d) for d in _KEEP) or any(f.startswith(d) for d in extra):
        return True
    return not any(f.startswith(d) for d in _SKIP)
