"""Reading a capture error: which kind it is, where in the user's code it was raised.

The CUDA error of a failed capture names no op ("operation failed due to a previous error during
capture"), so we classify the text of the whole exception chain (torch's capture_end often raises
a second error that hides the first) and take the innermost user frame of the original error:
capture errors are raised synchronously inside the op that broke the capture.
"""

from __future__ import annotations

import re
import traceback

__all__ = ["ERROR_CLASSES", "classify_error", "first_line", "error_text", "raised_at"]

ERROR_CLASSES = ("sync-during-capture", "unpinned-copy", "cross-device", "external-allocation", "illegal-op", "other")

# Boilerplate torch appends to every CUDA error; it mentions "device-side assertions" and would
# otherwise match the illegal-op patterns.
_BOILERPLATE = re.compile(r"(CUDA kernel errors might be asynchronously|For debugging consider passing|"
                          r"Compile with `?TORCH_USE_CUDA_DSA|Device-side assertion tracking)", re.I)

# (class, patterns): first match wins, so the specific texts come before the generic ones.
_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("unpinned-copy", ("cannot copy between cpu and cuda tensors during cuda graph capture",
                       "unless the cpu tensor is pinned")),
    ("cross-device", ("expected all tensors to be on the same device", "cross-device", "peer access",
                      "captured on wrong device", "different device", "invalid device ordinal",
                      "cudaerrorpeeraccess")),
    ("external-allocation", ("cudamalloc", "cumemalloc", "cumemcreate", "cumemmap", "alloc_failed",
                             "cublas_status_not_initialized", "cudnn_status_alloc", "out of memory")),
    ("illegal-op", ("cudaerrorstreamcaptureunjoined", "unjoined", "cudaerrorstreamcaptureimplicit",
                    "implicit dependency", "cudaerrorstreamcaptureisolation", "cudaerrorstreamcapturewrongthread",
                    "wrong thread", "cudaerrorstreamcapturemerge", "current_seed", "during cuda graph capture",
                    "graph capture is not supported", "not supported during capture")),
    ("sync-during-capture", ("cudaerrorstreamcaptureinvalidated", "cudaerrorstreamcaptureunsupported",
                             "operation not permitted when stream is capturing",
                             "operation failed due to a previous error during capture",
                             "capture sequence", "stream is capturing", "synchroniz")),
    ("illegal-op", ("illegal memory access", "illegal instruction", "device-side assert triggered",
                    "misaligned address", "operation not supported", "not permitted", "invalid argument",
                    "offset increment outside graph capture")),
)


def first_line(text: str, limit: int = 300) -> str:
    """The meaningful head of an error text: its first non-empty line, trimmed."""
    for line in str(text).splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[:limit - 3] + "..."
    return ""


def classify_error(text: str) -> str:
    """One of ERROR_CLASSES for a torch/CUDA error text (the message of the whole exception chain)."""
    keep = []
    for line in str(text).splitlines():
        if _BOILERPLATE.search(line):
            continue
        keep.append(line)
    low = "\n".join(keep).lower()
    for cls, patterns in _RULES:
        if any(p in low for p in patterns):
            return cls
    return "other"


def _chain(exc: BaseException) -> list[BaseException]:
    """exc, then what it was raised from / during, innermost (the original error) last."""
    out, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def _is_internal(filename: str) -> bool:
    """torch, the audit itself, the stdlib and site-packages are not where a person fixes things."""
    try:
        from audit.scan.sources.user_code import is_user_file
    except Exception:  # the tracer is optional here
        f = filename.replace("\\", "/")
        return (filename.startswith("<") or "/torch/" in f or "/audit/" in f or "site-packages" in f
                or "/lib/python" in f)
    return not is_user_file(filename)


def raised_at(exc: BaseException) -> dict | None:
    """Innermost user frame of the original error in the chain: the line that failed capture."""
    for e in reversed(_chain(exc)):
        frames = [f for f in traceback.extract_tb(e.__traceback__) if not _is_internal(f.filename)]
        if frames:
            f = frames[-1]
            return {"file": f.filename, "line": f.lineno, "function": f.name, "code": (f.line or "").strip()}
    return None


def error_text(exc: BaseException) -> str:
    """Messages of the chain, original error first (capture_end's complaint comes after it)."""
    parts = []
    for e in reversed(_chain(exc)):
        msg = "\n".join(l for l in str(e).splitlines() if l.strip() and not _BOILERPLATE.search(l))
        parts.append(f"{type(e).__name__}: {msg}")
    return "\n".join(parts)
