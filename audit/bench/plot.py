"""The bench figure: the headline latency per mode, scaling with batch and context, time per layer.

One PNG with up to three panels, so the report shows at a glance how far each mode is from the
bandwidth floor, how decode scales, and which layer kinds cost most.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from audit.bench.result import BenchResult

RATIO_COLORS = {0: "tab:blue", 4: "tab:orange", 128: "tab:green"}


def headline(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of the smallest batch at its smallest context: the latency figure the targets are about."""
    timed = df.dropna(subset=["ms_median"])
    if timed.empty:
        return timed
    b = timed["batch"].min()
    c = timed[timed["batch"] == b]["context"].min()
    return timed[(timed["batch"] == b) & (timed["context"] == c)]


def layer_source(res: BenchResult) -> tuple[list[dict], str]:
    """Per-layer times to show: a graph row's (smallest batch first), else the eager profile."""
    graph_rows = sorted((r for r in res.rows if r.per_layer), key=lambda r: (r.batch, r.context))
    if graph_rows:
        r = graph_rows[0]
        return r.per_layer, f"each layer alone under a graph, full mode B{r.batch} ctx {r.context}"
    return res.per_layer, "eager static step, CUDA events"


def plot(res: BenchResult, df: pd.DataFrame, path: Path, save) -> bool:
    """Draws the panels that have data and hands the figure to `save(fig)`; False when nothing was timed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    head = headline(df)
    if head.empty:
        return False
    timed = df.dropna(subset=["ms_median"])
    scaling = timed.groupby(["batch", "context"]).ngroups > 1
    layers, layer_title = layer_source(res)
    from audit.bench import roofline

    roof = any(p["bytes"] for p in roofline.points(res))
    panels = [_latency] + ([_scaling] if scaling else []) + ([_layers] if layers else []) + \
        ([roofline.panel] if roof else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        if panel is _layers:
            panel(ax, layers, layer_title)
        elif panel is roofline.panel:
            panel(ax, res)
        else:
            panel(ax, res, head if panel is _latency else timed)
    fig.tight_layout()
    save(fig)
    plt.close(fig)
    return True


MODE_ORDER = {"eager": 0, "ab": 1, "full": 2, "compile": 3}


def _latency(ax, res: BenchResult, head: pd.DataFrame) -> None:
    head = head.sort_values("mode", key=lambda m: m.map(MODE_ORDER))
    b, c = int(head["batch"].iloc[0]), int(head["context"].iloc[0])
    ms = head["ms_median"]
    ax.bar(range(len(head)), ms, color="tab:blue",
           yerr=[(ms - head["ms_p10"]).clip(lower=0), (head["ms_p90"] - ms).clip(lower=0)])
    ax.set_xticks(range(len(head)), list(head["mode"]))
    for i, m in enumerate(ms):
        ax.annotate(f"{m:.3g} ms", (i, m), ha="center", va="bottom", fontsize=8)
    floor = head["floor_ms"].dropna()
    if len(floor):
        ax.axhline(floor.iloc[0], color="r", ls="--", label=f"bandwidth floor {floor.iloc[0]:.2f} ms")
        ax.axhline(2 * floor.iloc[0], color="r", ls=":", label="2x floor")
        ax.legend(fontsize=7)
    if ms.max() > 20 * ms.min():
        ax.set_yscale("log")
    ax.set_ylabel("ms / decode step" + (" (log)" if ms.max() > 20 * ms.min() else ""))
    ax.set_title(f"{res.preset}: latency per mode, batch {b}, ctx {c}")


def _scaling(ax, res: BenchResult, timed: pd.DataFrame) -> None:
    styles = {"eager": "o--", "ab": "s-.", "full": "o-", "compile": "^:"}
    for (mode, ctx), g in timed.groupby(["mode", "context"]):
        g = g.sort_values("batch")
        ax.plot(g["batch"], g["tokens_per_s"], styles.get(mode, "x-"), label=f"{mode}, ctx {ctx}")
    ax.set_xscale("log", base=2)
    batches = sorted(timed["batch"].unique())
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_yscale("log")
    ax.set_xlabel("batch")
    ax.set_ylabel("tokens / s (log)")
    ax.set_title("scaling: throughput by batch and context")
    ax.legend(fontsize=7)


def _layers(ax, layers: list[dict], title: str) -> None:
    pl = pd.DataFrame(layers)
    ax.bar(pl["layer"], pl["ms"], color=[RATIO_COLORS.get(r, "gray") for r in pl["ratio"]],
           edgecolor=["k" if h == "hash" else "none" for h in pl["routing"]])
    ax.set_xlabel("layer (blue ratio 0, orange 4, green 128; outlined = hash routing)")
    ax.set_ylabel("ms")
    ax.set_title(title, fontsize=9)
