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

from audit.bench_result import BenchResult
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
    df["floor_ms"] = [(wb.get(b, 0) / (res.copy_tb_s * 1e12) * 1e3) if res.copy_tb_s else None for b in df["batch"]]
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
           ("speedup_vs_eager", "x eager", ".2f"), ("achieved_TB_s", "TB/s", ".2f"), ("x_floor", "x floor", ".2f"),
           ("bitwise_ok", "bitwise", "s"), ("fused", "fused", "yn"), ("drift", "drift vs unfused", ".1e"),
           ("build_s", "build s", ".0f"), ("note", "note", "s")]


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
             f"- copy ceiling measured in this run: {_fmt(res.copy_tb_s)} TB/s (device-to-device, read + write)",
             "- weight bytes read per decode step: " + ", ".join(
                 f"batch {b}: {v / 1e9:.2f} GB" for b, v in res.weight_bytes.items()),
             f"- weight-only decode kernels (dsv4/kernels): {'on' if res.kernels else 'off'}; `fused`: the layers' "
             "pointwise work compiled by inductor inside our graphs (dsv4/decode/fuse.py)",
             "- floor = weight bytes / copy ceiling; `x floor` = measured / floor; graph rows are checked "
             "bitwise against the eager run of the same functions before timing; `drift vs unfused` = max "
             "relative logit difference of a fused step vs the unfused static path from the same state (in "
             "bfloat16 the FP8 activation and bf16 roundings turn fp32 summation-order differences into whole-ulp "
             "flips that grow with depth; float32 isolates the function: 6 flash-h200 layers on the CPU gave "
             "9.4e-07 in float32 and 2.3e-02 in bfloat16)",
             "- contexts are reached with random cache entries at that position (`start_at`): the static "
             "step's work depends on max_seq_len and batch, not on the cached values", "",
             "| " + " | ".join(h for _, h, _ in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(_fmt(r[c], spec) for c, _, spec in COLUMNS) + " |")
    reasons = [(r.mode, x) for r in res.rows for x in r.skip_reasons]
    if reasons:
        lines += ["", "## torch.compile cudagraph skip reasons", ""] + [f"- {x}" for _, x in reasons]
    for r in [r for r in res.rows if r.kernels][:1]:  # the first profiled full row
        lines += ["", f"## GPU kernels of one full-graph replay (B{r.batch}, ctx {r.context}; torch.profiler)", "",
                  "| kernel | launches / step | us / step |", "|---|---|---|"]
        lines += [f"| `{k['kernel']}` | {k['per_step']:.0f} | {k['us_per_step']:.1f} |" for k in r.kernels]
    graph_rows = [r for r in res.rows if r.per_layer]
    for title, data in ([(f"each layer alone under a graph, full mode B{graph_rows[0].batch} ctx "
                          f"{graph_rows[0].context}", graph_rows[0].per_layer)] if graph_rows else []) + \
            ([("eager static step, CUDA events", res.per_layer)] if res.per_layer else []):
        g = pd.DataFrame(data).groupby(["ratio", "routing"])["ms"].agg(["count", "mean", "sum"]).reset_index()
        lines += ["", f"## Per-layer breakdown ({title})", "",
                  "| ratio | routing | layers | mean ms/layer | total ms |", "|---|---|---|---|---|"]
        lines += [f"| {r.ratio} | {r.routing} | {r['count']} | {r['mean']:.3f} | {r['sum']:.2f} |"
                  for _, r in g.iterrows()]
    if plot_name:
        lines += ["", f"![latency per mode and per-layer breakdown]({plot_name})"]
    return "\n".join(lines) + "\n"


def plot(res: BenchResult, path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = frame(res).dropna(subset=["ms_median"])
    if df.empty:
        return False
    two = bool(res.per_layer or any(r.per_layer for r in res.rows))
    fig, axes = plt.subplots(1, 2 if two else 1, figsize=(12 if two else 6, 4), squeeze=False)
    ax = axes[0][0]
    labels = [f"{m}\nB{b} ctx{c}" for m, b, c in zip(df["mode"], df["batch"], df["context"])]
    ax.bar(range(len(df)), df["ms_median"], yerr=[(df["ms_median"] - df["ms_p10"]).clip(lower=0), (df["ms_p90"] - df["ms_median"]).clip(lower=0)])
    ax.set_xticks(range(len(df)), labels, fontsize=7)
    ax.set_ylabel("ms / decode step")
    if df["ms_median"].max() > 20 * df["ms_median"].min():  # eager and graphs differ by orders of magnitude
        ax.set_yscale("log")
        ax.set_ylabel("ms / decode step (log)")
    for i, m in enumerate(df["ms_median"]):
        ax.annotate(f"{m:.3g}", (i, m), ha="center", va="bottom", fontsize=7)
    floors = df["floor_ms"].dropna()
    if len(floors):
        ax.axhline(floors.iloc[0], color="r", ls="--", label="bandwidth floor (batch of first row)")
        ax.legend(fontsize=7)
    ax.set_title(f"{res.preset}: decode latency per mode")
    graph_rows = [r for r in res.rows if r.per_layer]
    layers = graph_rows[0].per_layer if graph_rows else res.per_layer
    if layers:
        pl = pd.DataFrame(layers)
        colors = {0: "tab:blue", 4: "tab:orange", 128: "tab:green"}
        ax2 = axes[0][1]
        ax2.bar(pl["layer"], pl["ms"], color=[colors.get(r, "gray") for r in pl["ratio"]],
                hatch=None, edgecolor=["k" if h == "hash" else "none" for h in pl["routing"]])
        ax2.set_xlabel("layer (blue ratio 0, orange 4, green 128; outlined = hash routing)")
        ax2.set_ylabel("ms, each layer alone under a graph" if graph_rows else "ms (eager)")
        ax2.set_title("per-layer time")
    fig.tight_layout()
    _atomic(path, lambda f: fig.savefig(f, format="png", dpi=110), binary=True)
    plt.close(fig)
    return True


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
