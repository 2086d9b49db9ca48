"""Bench output: a rich table for the terminal, reports/bench-<preset>.md, a PNG plot, the raw JSON.

Files are written through a temporary name and renamed, so a report is never half-written.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pandas as pd
from rich.table import Table

from audit.bench import plot as bench_plot
from audit.bench import roofline
from audit.bench.plot import headline, layer_source
from audit.bench.profile import families
from audit.bench.result import BenchResult
from audit.errors import AuditError


def frame(res: BenchResult) -> pd.DataFrame:
    """One row per (mode, batch, context) with speedup vs eager and bandwidth vs the copy ceiling."""
    df = pd.DataFrame([r.__dict__ for r in res.rows])
    if df.empty:
        return df
    eager = df[df["mode"] == "eager"].set_index(["batch", "context"])["ms_median"]
    df["speedup_vs_eager"] = [
        (eager.get((b, c)) / m) if m and eager.get((b, c)) else None
        for b, c, m in zip(df["batch"], df["context"], df["ms_median"])
    ]
    wb = {int(k): v for k, v in res.weight_bytes.items()}
    df["weight_GB"] = [wb.get(b, 0) / 1e9 for b in df["batch"]]
    copy = [c if pd.notna(c) and c else res.copy_tb_s for c in df["copy_tb_s"]]  # the row's own run, else the header's
    df["floor_ms"] = [(wb.get(b, 0) / (c * 1e12) * 1e3) if c else None for b, c in zip(df["batch"], copy)]
    df["achieved_TB_s"] = [(wb.get(b, 0) / (m * 1e-3) / 1e12) if m else None for b, m in zip(df["batch"], df["ms_median"])]
    df["x_floor"] = [(m / f) if m and f else None for m, f in zip(df["ms_median"], df["floor_ms"])]
    return df


def _fmt(v, spec: str = ".2f") -> str:
    if spec == "yn":
        return "yes" if v is not None and v == v and bool(v) else "-"
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    return format(v, spec) if isinstance(v, (int, float)) else str(v)


COLUMNS = [("mode", "mode", "s"), ("batch", "batch", "d"), ("context", "ctx", "d"), ("steps", "steps", "d"),
           ("ms_median", "ms/token", ".2f"),
           ("ms_p10", "p10", ".2f"), ("ms_p90", "p90", ".2f"), ("tokens_per_s", "tok/s", ".1f"),
           ("speedup_vs_eager", "x eager", ".2f"), ("achieved_TB_s", "TB/s", ".2f"), ("copy_tb_s", "copy TB/s", ".2f"),
           ("x_floor", "x floor", ".2f"), ("bitwise_ok", "bitwise", "s"), ("fused", "fused", "yn"), ("drift", "drift vs unfused", ".1e"),
           ("build_s", "build s", ".0f"), ("commit", "commit", "s"), ("note", "note", "s")]


def rich_table(res: BenchResult) -> Table:
    """Compact terminal table; notes go under it so the numbers stay readable at 80 columns."""
    df = frame(res)
    floor = f", floor {df['floor_ms'].dropna().iloc[0]:.2f} ms" if df["floor_ms"].notna().any() else ""
    kern = "kernels on" if res.kernels else "kernels off"
    t = Table(title=f"{res.preset}: {res.n_layers} layers, {res.dtype}, {res.device}, {kern}{floor}")
    cols = [("mode", "mode", "s"), ("batch", "B", "d"), ("context", "ctx", "d"), ("ms_median", "ms/tok", ".2f"),
            ("tokens_per_s", "tok/s", ".1f"), ("speedup_vs_eager", "x eager", ".2f"),
            ("achieved_TB_s", "TB/s", ".2f"), ("x_floor", "x floor", ".1f"), ("bitwise_ok", "bitwise", "s")]
    for _, head, _ in cols:
        t.add_column(head, justify="left" if head == "mode" else "right", no_wrap=True)
    notes = []
    for _, r in df.iterrows():
        t.add_row(*[_fmt(r[c], spec) for c, _, spec in cols])
        if r["note"]:
            notes.append(f"{r['mode']} B{r['batch']} ctx{r['context']}: {r['note']}")
    t.caption = "\n".join(notes) or None
    return t


def markdown(res: BenchResult, plot_name: str | None) -> str:
    df = frame(res)
    lines = [f"# Decode bench: `{res.preset}`", "",
             f"- device: {res.device}; torch {res.torch_version}; {res.n_layers} layers; {res.dtype}; "
             "timed steps per row in `steps` (CUDA events, host clock on CPU; median, p10, p90)",
             (f"- copy ceiling: {_fmt(res.copy_tb_s)} TB/s (device-to-device, read + write, measured by the bench; "
              "a row measured by a later run uses that run's ceiling, in the `copy TB/s` column)") if res.copy_tb_s
             else "- copy ceiling: not measured (no CUDA), so no floor",
             "- weight bytes read per decode step: " + ", ".join(
                 f"batch {b}: {v / 1e9:.2f} GB" for b, v in res.weight_bytes.items()),
             f"- weight-only decode kernels (dsv4/kernels): {'on' if res.kernels else 'off'}; `fused`: the layers' "
             "pointwise work compiled by inductor inside our graphs (dsv4/decode/fuse.py); kernels chained by "
             "programmatic dependent launch unless a row's note says DSV4_PDL=0 (dsv4/kernels/_pdl.py)",
             "- floor = weight bytes / copy ceiling; `x floor` = measured / floor; graph rows are checked "
             "bitwise against the eager run of the same functions before timing; `drift vs unfused` = max "
             "relative logit difference of a fused step vs the unfused static path from the same state (in "
             "bfloat16 the FP8 activation and bf16 roundings turn fp32 summation-order differences into whole-ulp "
             "flips that grow with depth; in float32 tests/test_fuse_gpu.py holds the fused graphs to the "
             "reference path within 1e-5)",
             "- contexts are reached with random cache entries at that position (`start_at`): the static "
             "step's work depends on max_seq_len and batch, not on the cached values",
             "- `commit`: the source tree a row was measured at (rows of several runs merge with `--append`)"]
    lines += _targets(df)
    lines += ["", "## All rows", "", "| " + " | ".join(h for _, h, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(_fmt(r[c], spec) for c, _, spec in COLUMNS) + " |")
    lines += _scaling(df)
    reasons = [(r.mode, x) for r in res.rows for x in r.skip_reasons]
    if reasons:
        lines += ["", "## torch.compile cudagraph skip reasons", ""] + [f"- {x}" for _, x in reasons]
    if res.warnings:
        lines += ["", "## Warnings raised during the run (collected here, not printed)", ""] + \
            [f"- {w}" for w in res.warnings]
    lines += _time_by_family(res)
    lines += roofline.markdown(res)
    layers, layer_title = layer_source(res)
    sources = [(layer_title, layers)] if layers else []
    if res.per_layer and layers is not res.per_layer:
        sources.append(("eager static step, CUDA events", res.per_layer))
    for title, data in sources:
        g = pd.DataFrame(data).groupby(["ratio", "routing"])["ms"].agg(["count", "mean", "sum"]).reset_index()
        lines += ["", f"## Per-layer breakdown ({title})", "",
                  "| ratio | routing | layers | mean ms/layer | total ms |", "|---|---|---|---|---|"]
        lines += [f"| {r.ratio} | {r.routing} | {r['count']} | {r['mean']:.3f} | {r['sum']:.2f} |"
                  for _, r in g.iterrows()]
    if plot_name:
        lines += ["", f"![latency per mode, scaling, per-layer breakdown]({plot_name})"]
    return "\n".join(lines) + "\n"


TARGETS = (("graph decode within 2x the bandwidth floor", "full", lambda full, other: full <= 2 * other, "floor"),
           ("graph decode at least 8x faster than eager", "full", lambda full, other: other >= 8 * full, "eager"),
           ("graph decode faster than torch.compile reduce-overhead", "full", lambda full, other: full < other,
            "compile"))


def _targets(df: pd.DataFrame) -> list[str]:
    """The issue's three figures at the headline batch and context, judged from the rows measured."""
    head = headline(df)
    full = head[head["mode"] == "full"]["ms_median"]
    if full.empty:
        return []
    f = float(full.iloc[0])
    b, c = int(head["batch"].iloc[0]), int(head["context"].iloc[0])
    out = ["", f"## Targets (batch {b}, ctx {c}, full graph {f:.2f} ms/token)", "",
           "| target | against | met |", "|---|---|---|"]
    for text, _, ok, against in TARGETS:
        if against == "floor":
            other = head["floor_ms"].dropna()
            label = f"floor {other.iloc[0]:.2f} ms: {f / other.iloc[0]:.1f}x" if len(other) else None
        else:
            other = head[head["mode"] == against]["ms_median"].dropna()
            label = f"{against} {other.iloc[0]:.2f} ms: {other.iloc[0] / f:.2f}x" if len(other) else None
        if label:
            out.append(f"| {text} | {label} | {'yes' if ok(f, float(other.iloc[0])) else '**no**'} |")
    return out


def _scaling(df: pd.DataFrame) -> list[str]:
    """ms/token per mode for every (batch, context), with the fastest mode's throughput and distances."""
    timed = df.dropna(subset=["ms_median"])
    if timed.groupby(["batch", "context"]).ngroups < 2:
        return []
    modes = [m for m in ("eager", "ab", "full", "compile") if m in set(timed["mode"])]
    out = ["", "## Scaling (ms/token per mode; the fastest mode's throughput)", "",
           "| batch | ctx | " + " | ".join(modes) + " | fastest | tok/s | x eager | x floor |",
           "|" + "---|" * (len(modes) + 6)]
    for (b, c), g in timed.groupby(["batch", "context"]):
        ms = g.set_index("mode")["ms_median"]
        best = g.loc[g["ms_median"].idxmin()]
        out.append(f"| {b} | {c} | " + " | ".join(_fmt(ms.get(m)) for m in modes) +
                   f" | {best['mode']} | {_fmt(best['tokens_per_s'], '.1f')} | "
                   f"{_fmt(best['speedup_vs_eager'])} | {_fmt(best['x_floor'], '.1f')} |")
    return out


def _time_by_family(res: BenchResult) -> list[str]:
    """GPU time of one full-graph step by kernel family for every profiled row, then the top kernels
    of the headline one (smallest batch, then smallest context)."""
    rows = sorted((r for r in res.rows if r.kernels), key=lambda r: (r.batch, r.context))
    if not rows:
        return []
    fams = [families(r.kernels) for r in rows]
    names = list(dict.fromkeys(n for f in fams for n in sorted(f, key=lambda n: -f[n]["us_per_step"])))
    names = [n for n in names if n != "not itemized"] + [n for n in names if n == "not itemized"]
    out = ["", "## Where a full-graph step's GPU time goes (torch.profiler over replays; us per step, kernels per step)", "",
           "With programmatic dependent launch a kernel starts while the previous one runs and waits inside it, "
           "so its profiled duration includes that wait: durations overlap, their sum can exceed the step time, "
           "and a family's time (and the roofline's % of the ceiling below) is an upper (lower) bound.", "",
           "| kernel family | " + " | ".join(f"B{r.batch} ctx {r.context}" for r in rows) + " |",
           "|" + "---|" * (len(rows) + 1),
           "| **all kernels** | " + " | ".join(f"**{r.kernels[0]['us_per_step']:.0f}** ({r.kernels[0]['per_step']:.0f})"
                                             for r in rows) + " |",
           "| kernels per layer (all / layers) | " + " | ".join(f"{r.kernels[0]['per_step'] / res.n_layers:.1f}"
                                                              for r in rows) + " |"]
    for n in names:
        out.append(f"| {n} | " + " | ".join(f"{f[n]['us_per_step']:.0f} ({f[n]['per_step']:.0f})" if n in f else "-"
                                            for f in fams) + " |")
    top = rows[0]
    out += ["", f"### Top kernels, B{top.batch} ctx {top.context}", "",
            "| kernel | launches / step | us / step |", "|---|---|---|"]
    out += [f"| `{k['kernel']}` | {k['per_step']:.0f} | {k['us_per_step']:.1f} |" for k in top.kernels[:16]]
    return out


def plot(res: BenchResult, path: Path) -> bool:
    return bench_plot.plot(res, frame(res), path,
                           lambda fig: _atomic(path, lambda f: fig.savefig(f, format="png", dpi=110), binary=True))


def _atomic(path: Path, write, binary: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def json_path(out_dir: Path, preset: str) -> Path:
    return out_dir / f"bench-{preset}.json"


def write_json(res: BenchResult, out_dir: Path) -> Path:
    path = json_path(out_dir, res.preset)
    _atomic(path, lambda f: json.dump(res.to_json(), f, indent=1))
    return path


def read_json(path: Path) -> BenchResult | None:
    """A saved result, or None when there is none (a bad file is an error, not silently replaced)."""
    if not path.exists():
        return None
    try:
        return BenchResult.from_json(json.loads(path.read_text()))
    except (ValueError, TypeError) as e:
        raise AuditError(f"{path}: not a bench result ({e})") from None


def write_reports(res: BenchResult, out_dir: Path) -> list[Path]:
    stem = f"bench-{res.preset}"
    png = out_dir / f"{stem}.png"
    has_plot = plot(res, png)
    md = out_dir / f"{stem}.md"
    _atomic(md, lambda f: f.write(markdown(res, png.name if has_plot else None)))
    return [md, write_json(res, out_dir)] + ([png] if has_plot else [])
