"""Findings and the Inventory that holds them: categories, severities, and what to tell a person.

An Inventory is a pandas DataFrame with one row per (category, file, line, op): the table an
engineer would otherwise keep by hand (a hand-kept sync-violation inventory of a real decode port was the model), but
generated from a trace. Category ids are stable; every category carries the default text for
"why it matters under capture" and "the usual fix", which a finding may sharpen.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd

__all__ = ["CATEGORIES", "SCHEMA_VERSION", "SEVERITIES", "Category", "Finding", "Inventory"]

# Most severe first. blocks-capture: capture raises; silent-corruption: replay runs and is wrong.
SEVERITIES = ("blocks-capture", "silent-corruption", "performance", "info")
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class Category:
    id: str
    title: str
    severity: str  # default severity; a rule may raise or lower it for one finding
    why: str
    fix: str


def _c(id, title, severity, why, fix):
    return id, Category(id, title, severity, why, fix)


CATEGORIES: dict[str, Category] = dict([
    _c("host-sync", "Device-to-host reads and waits", "blocks-capture",
       "The host waits for the device to read a value (or a size). Inside torch.cuda.graph this "
       "invalidates the capture (cudaErrorStreamCaptureInvalidated, the op is not named) and leaves "
       "the process poisoned; in eager decode it stalls the CPU every step so launches cannot run ahead.",
       "Keep the value on the device: torch.where / masks instead of branching on it, fixed-size "
       "top-k or nonzero_static instead of nonzero, take sizes from host-side metadata, pass "
       "output_size= to repeat_interleave and static maxima to anything data-dependent."),
    _c("step-allocation", "Tensors allocated inside the step", "info",
       "Allocations in a captured region come from the graph's private pool and are legal; they cost "
       "allocator work in eager mode. It becomes silent corruption when the new tensor escapes into "
       "state a later step reads: replay keeps reading the buffer captured the first time.",
       "Preallocate once (outside the step) and write with out= / copy_ / in-place ops; state that "
       "lives across steps must be a persistent buffer updated in place."),
    _c("data-dependent-control", "Data-dependent control flow", "silent-corruption",
       "The steps run different op sequences (a Python branch on tensor values or on a host counter). "
       "A graph records one path and replays it every time, whatever the data says.",
       "Compute both sides and select with torch.where / masks, make the loop count a static maximum "
       "with masking, or move the decision outside the graph (one graph per branch, chosen on the host)."),
    _c("baked-host-value", "Host values baked into the graph", "silent-corruption",
       "A Python number (position, slice bound, scalar operand, small host tensor) changes between "
       "steps. Capture freezes the value of the step it recorded; replay reuses it forever.",
       "Keep the value in a device tensor that prepare() updates in place (copy_/fill_ outside the "
       "graph) and index with it; or make it part of the graph key (one graph per bucket)."),
    _c("dynamic-shape", "Shapes that change between steps", "silent-corruption",
       "A tensor's shape differs between steps. A graph bakes launch sizes and strides: replay either "
       "computes on the captured shape (wrong, silently) or reads past a buffer.",
       "Use fixed maximum shapes with masks (e.g. attend over the whole preallocated cache with a "
       "validity mask), or capture one graph per shape bucket."),
    _c("stale-input-pointer", "Inputs read from a new address each step", "silent-corruption",
       "The step reads a tensor it did not produce, and that tensor lives at a new storage every step. "
       "Replay reads the address captured the first time, i.e. stale data.",
       "Allocate static input buffers once and fill them with copy_ in prepare() (outside the graph); "
       "never rebind the attribute the step reads."),
    _c("cpu-side-effect", "Python / module state mutated by the step", "silent-corruption",
       "The step changes Python state (counters, lists, attributes). Replay runs only the recorded "
       "kernels, so the Python side effect happens once at capture and never again.",
       "Keep the state on the device and update it in the graph (pos.add_(1)), or do the bookkeeping "
       "in prepare(), outside the captured region."),
    _c("rng", "Random number generation in the step", "info",
       "Random ops inside a graph replay with the generator state registered at capture. The default "
       "CUDA generator is registered automatically (fresh numbers each replay, but a different stream "
       "than eager); other generators replay the same numbers or fail to capture.",
       "Sample outside the step into a static buffer, or register the generator with the graph "
       "(graph.register_generator_state); never use CPU generators for device sampling."),
    _c("cross-device", "Work that spans devices within one step", "silent-corruption",
       "A graph belongs to one device and one capturing stream. Ops or copies touching another device "
       "are not in it (empty graphs, stale replay on the other device).",
       "One graph per device, captured on a stream created for that device inside "
       "torch.cuda.device(dev); move data between graphs with copies outside them."),
    _c("unjoined-stream", "Side-stream work not forked from or joined to the step's stream", "silent-corruption",
       "Only streams that wait on the capturing stream are part of the graph: work issued on another stream "
       "with no wait on the step's stream before it runs once while capturing and replay skips it (no error: "
       "a toy decoder's graph held 5 kernel nodes against 7 eager kernels). Work forked but not waited on "
       "after it fails the capture (unjoined), and in eager decode the step's stream reads it too early.",
       "Take the streams at call time and fork and join around the block: `s.wait_stream(torch.cuda.current_stream())` "
       "before it and `torch.cuda.current_stream().wait_stream(s)` after it (or events recorded and waited on "
       "both ways)."),
    _c("pageable-copy", "Host<->device copies in the step", "blocks-capture",
       "Capture refuses copies between pageable CPU memory and the device ('unless the CPU tensor is "
       "pinned'), and a device->host copy also synchronizes.",
       "Stage host data in a persistent pinned buffer and copy it to a static device buffer with "
       "non_blocking=True in prepare(), outside the graph."),
    _c("capture-failure", "Trial capture raised", "blocks-capture",
       "torch.cuda.graph raised during a trial capture; the CUDA error names no op.",
       "Bisect to the leaf module and match its trace against the host-sync / pageable-copy findings."),
    _c("uncaptured-kernel", "Kernels missing from the graph", "silent-corruption",
       "Kernels ran eagerly during capture but are not graph nodes (launched on another stream or "
       "device, or an empty graph): replay silently skips them.",
       "Pass torch.cuda.current_stream(device) to every external launch at call time; never cache streams."),
    _c("replay-mismatch", "Replay differs from eager", "silent-corruption",
       "Graph replay output differs bitwise from eager on the same inputs.",
       "Bisect to the first module whose replayed output differs."),
    _c("lazy-init", "Lazy initialization during capture", "blocks-capture",
       "JIT compilation, autotuning, handle or workspace creation inside capture either fails or "
       "records one-time work.",
       "Warm up every shape on the capture stream before capturing."),
])

FIELDS = ("category", "severity", "file", "line", "function", "module", "op", "count_per_step", "message", "fix",
          "caller_file", "caller_line", "caller_function")
SCHEMA_VERSION = "1.0"  # inventory.json; a reader refuses another major version
KEY = ["category", "file", "line", "op"]


@dataclass
class Finding:
    """One hazard at one source line. `fix` defaults to the category's usual fix."""

    category: str
    severity: str
    file: str
    line: int
    function: str
    module: str
    op: str
    count_per_step: float
    message: str
    fix: str = ""
    # the innermost frame in the target's own files that led to file:line (the same when the hazard is there)
    caller_file: str = ""
    caller_line: int = 0
    caller_function: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # rank, step, ...: kept in JSON

    def __post_init__(self):
        if self.category not in CATEGORIES:
            raise ValueError(f"unknown finding category {self.category!r}")
        if self.severity not in SEVERITY_RANK:
            raise ValueError(f"unknown severity {self.severity!r}")
        self.fix = self.fix or CATEGORIES[self.category].fix
        if not self.caller_file:
            self.caller_file, self.caller_line, self.caller_function = self.file, self.line, self.function

    def to_dict(self) -> dict:
        d = {f: getattr(self, f) for f in FIELDS}
        d.update(self.extra)
        return d


class Inventory:
    """The findings of one scan (a DataFrame, merged per category/file/line/op) plus its metadata."""

    def __init__(self, df: pd.DataFrame | None = None, meta: dict | None = None):
        self.df = df if df is not None else pd.DataFrame(columns=list(FIELDS))
        self.meta = dict(meta or {})

    # ---------------------------------------------------------------- building
    @classmethod
    def from_findings(cls, findings: Iterable[Finding | dict], meta: dict | None = None) -> Inventory:
        rows = [f.to_dict() if isinstance(f, Finding) else dict(f) for f in findings]
        df = pd.DataFrame(rows, columns=None if rows else list(FIELDS))
        for col in FIELDS:
            if col not in df.columns:
                df[col] = None
        return cls(_merge(df), meta)

    # ---------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self.df)

    def __repr__(self) -> str:
        counts = ", ".join(f"{int((self.df.severity == s).sum())} {s}" for s in SEVERITIES)
        return f"<Inventory {self.meta.get('target', '')!s}: {len(self)} findings ({counts})>"

    def findings(self) -> list[dict]:
        """Rows as plain dicts (NaN-free), most severe first."""
        out = []
        for r in self.df.to_dict("records"):
            d = {k: _plain(v) for k, v in r.items()}
            out.append({k: v for k, v in d.items() if k in FIELDS or v is not None})
        return out

    def where(self, category: str | None = None, severity: str | None = None, file: str | None = None) -> pd.DataFrame:
        df = self.df
        if category:
            df = df[df.category == category]
        if severity:
            df = df[df.severity == severity]
        if file:
            df = df[df.file.astype(str).str.endswith(file)]
        return df

    def blocking(self) -> pd.DataFrame:
        """Findings that break capture or make replay wrong."""
        return self.df[self.df.severity.isin(SEVERITIES[:2])]

    def summary(self) -> pd.DataFrame:
        """category x severity counts of findings, ordered by worst severity then count."""
        if self.df.empty:
            return pd.DataFrame(columns=list(SEVERITIES))
        t = pd.crosstab(self.df.category, self.df.severity)
        t = t.reindex(columns=list(SEVERITIES), fill_value=0)
        order = sorted(t.index, key=lambda c: (tuple(-t.loc[c, s] for s in SEVERITIES), c))
        return t.loc[order]

    def to_json_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "summary": self.meta, "findings": self.findings()}

    @classmethod
    def from_json_dict(cls, data: dict) -> Inventory:
        if not isinstance(data, dict) or "findings" not in data:
            raise ValueError("not an inventory.json (no 'findings' list)")
        return cls.from_findings(data["findings"], data.get("summary", {}))


def _merge(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (category, file, line, op): most severe severity, largest count per step."""
    if df.empty:
        return df.reset_index(drop=True)
    df = df.copy()
    df["line"] = df["line"].fillna(0).astype(int)
    df["_rank"] = df.severity.map(SEVERITY_RANK)
    df = df.sort_values(["_rank", "count_per_step"], ascending=[True, False], kind="stable")
    counts = df.groupby(KEY, sort=False, dropna=False)["count_per_step"].transform("max")
    df["count_per_step"] = counts
    df = df.drop_duplicates(KEY, keep="first")
    cat_rank = {c: i for i, c in enumerate(CATEGORIES)}
    df["_cat"] = df.category.map(cat_rank)
    df = df.sort_values(["_rank", "_cat", "file", "line"], kind="stable")
    return df.drop(columns=["_rank", "_cat"]).reset_index(drop=True)


def _plain(v):
    """numpy scalars and NaN -> JSON-friendly Python values."""
    if v is None:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        try:
            return v.item()
        except (ValueError, AttributeError):
            return v
    return v
