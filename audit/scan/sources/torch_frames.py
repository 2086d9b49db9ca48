"""Where inside torch's own Python code a host read happened.

Torch's frames are never a finding's site: the site is the library or target line that called into torch.
When that line shows no read (`Categorical(logits=scores)`, `if tok in ids:`), the read is torch's own work:
a distribution validating its arguments, `Tensor.__contains__`. The record keeps the torch functions the
read went through, so the finding can say which and the fix can be the right one.
"""

from __future__ import annotations

import os

import torch

from audit.scan.sources.user_code import HIDDEN, frame_kind

__all__ = ["inside", "torch_lines"]

_TORCH = os.path.join(os.path.realpath(os.path.dirname(torch.__file__)), "")


def torch_lines(frame, roots: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """(file, line) of each frame in torch's own Python code between `frame` and the first library or target frame,
    innermost first: where inside torch an op was called (`torch.tensor(sizes, device=values.device)` in
    torch.nested's `jagged_from_list`, below the wrappers torch puts around a dispatch mode); () when the op was
    the site's own call."""
    out = []
    while frame is not None:
        name = frame.f_code.co_filename
        if frame_kind(name, roots) != HIDDEN:
            break
        if name and not name.startswith("<") and os.path.realpath(name).startswith(_TORCH):
            out.append((name, frame.f_lineno))
        frame = frame.f_back
    return tuple(out)


def inside(frame, roots: tuple[str, ...]) -> str:
    """The torch functions between `frame` (the read's wrapper, outwards) and the first library or target
    frame, as "`Categorical.__init__` -> `Distribution.__init__` (torch/distributions/distribution.py:76)"
    (outermost first, the innermost with its line); "" when the read is the site's own call."""
    chain = []
    while frame is not None:
        name = frame.f_code.co_filename
        if frame_kind(name, roots) != HIDDEN:
            break
        path = os.path.realpath(name) if name and not name.startswith("<") else ""
        if path.startswith(_TORCH):
            chain.append((getattr(frame.f_code, "co_qualname", frame.f_code.co_name),
                          "torch/" + os.path.relpath(path, _TORCH).replace(os.sep, "/"), frame.f_lineno))
        frame = frame.f_back
    if not chain:
        return ""
    inner, names = chain[0], list(dict.fromkeys(f"`{q}`" for q, _, _ in reversed(chain)))
    if len(names) > 2:  # formatting a tensor goes through half a dozen of torch's functions
        names = [names[0], "...", names[-1]]
    return f"{' -> '.join(names)} ({inner[1]}:{inner[2]})"
