"""Findings and the Inventory that holds them: categories, severities, and what to tell a person.

An Inventory is a pandas DataFrame with one row per (category, file, line, op, caller): the table an
engineer would otherwise keep by hand, generated from a trace. Category ids are stable; every
category carries the default text for "why it matters under capture" and "the usual fix", which
a finding may sharpen.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
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


def _load_categories() -> dict[str, Category]:
    """categories.json: the stable ids in report order, with the default 'why' and 'fix' texts
    (data, so the SARIF rules, the docs and the findings quote one source)."""
    rows = json.loads((Path(__file__).parent / "categories.json").read_text(encoding="utf-8"))
    return {r["id"]: Category(**r) for r in rows}


CATEGORIES: dict[str, Category] = _load_categories()

FIELDS = ("category", "severity", "file", "line", "function", "module", "op", "count_per_step", "message", "fix",
          "caller_file", "caller_line", "caller_function")
SCHEMA_VERSION = "1.0"  # inventory.json; a reader refuses another major version
KEY = ["category", "file", "line", "op", "caller_file", "caller_line"]  # a library line per calling line


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
    """One row per (category, file, line, op, caller): most severe severity, largest count per step."""
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
