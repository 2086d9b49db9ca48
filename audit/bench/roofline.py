"""The roofline of a decode step: each weight-reading kernel family's bytes against its time.

A family's bytes are the weights it must stream per step (BenchResult.bytes_by_kind: FP8 Linears,
bf16 Linears and the LM head, the routed experts a batch is expected to touch); its time is what the
profiler measured for its kernels. At the copy ceiling a family would sit on the line time = bytes /
ceiling; the distance above the line is what latency, launch gaps and issue rate cost it. Families
that stream no weights (inductor's fused pointwise work, cuBLAS, the layer kernels) have no bytes on
this axis: the table lists their time as the part of the step no weight stream explains.
"""

from __future__ import annotations

from audit.bench.profile import FAMILY_BYTES, families
from audit.bench.result import BenchResult


def points(res: BenchResult) -> list[dict]:
    """One dict per (profiled full row, family): label, family, bytes (None: no weights), us, and for
    weight families the achieved TB/s and its share of the row's copy ceiling."""
    out = []
    for r in sorted((r for r in res.rows if r.kernels), key=lambda r: (r.batch, r.context)):
        kinds = res.bytes_by_kind.get(str(r.batch), {})
        ceiling = r.copy_tb_s or res.copy_tb_s
        for fam, v in families(r.kernels).items():
            nbytes = kinds.get(FAMILY_BYTES.get(fam, ""))
            tb_s = nbytes / (v["us_per_step"] * 1e-6) / 1e12 if nbytes and v["us_per_step"] else None
            out.append({"row": f"B{r.batch} ctx {r.context}", "family": fam, "bytes": nbytes,
                        "us": v["us_per_step"], "tb_s": tb_s,
                        "pct": 100 * tb_s / ceiling if tb_s and ceiling else None,
                        "floor_us": nbytes / (ceiling * 1e12) * 1e6 if nbytes and ceiling else None})
    return out


def markdown(res: BenchResult) -> list[str]:
    pts = points(res)
    if not any(p["bytes"] for p in pts):
        return []
    lines = ["", "## Roofline: weight bytes streamed vs time, by kernel family", "",
             "| row | family | weight GB / step | us / step | at the ceiling, us | TB/s | % of copy ceiling |",
             "|---|---|---|---|---|---|---|"]
    for p in sorted(pts, key=lambda p: (p["row"], p["bytes"] is None, -p["us"])):
        if p["bytes"]:
            lines.append(f"| {p['row']} | {p['family']} | {p['bytes'] / 1e9:.2f} | {p['us']:.0f} | {p['floor_us']:.0f} | "
                         f"{p['tb_s']:.2f} | {p['pct']:.0f}% |")
        else:
            lines.append(f"| {p['row']} | {p['family']} | - (no weights) | {p['us']:.0f} | - | - | - |")
    return lines


def panel(ax, res: BenchResult) -> bool:
    """Log-log bytes vs time per weight family and row, with the copy-ceiling line; False when empty."""
    pts = [p for p in points(res) if p["bytes"]]
    if not pts:
        return False
    ceiling = next((r.copy_tb_s for r in res.rows if r.kernels and r.copy_tb_s), res.copy_tb_s)
    markers = dict(zip(sorted({p["row"] for p in pts}), "os^Dv"))
    colors = dict(zip(sorted({p["family"] for p in pts}), ("tab:blue", "tab:orange", "tab:green", "tab:purple")))
    for p in pts:
        ax.scatter(p["bytes"] / 1e9, p["us"] / 1e3, marker=markers[p["row"]], color=colors[p["family"]], s=40)
        ax.annotate(f"{p['pct']:.0f}%", (p["bytes"] / 1e9, p["us"] / 1e3), fontsize=7, xytext=(4, 2),
                    textcoords="offset points")
    lo, hi = min(p["bytes"] for p in pts) / 2e9, max(p["bytes"] for p in pts) * 2 / 1e9
    if ceiling:
        ax.plot([lo, hi], [lo / ceiling, hi / ceiling], "r--", label=f"copy ceiling {ceiling:.2f} TB/s")
    for fam, c in colors.items():
        ax.scatter([], [], color=c, label=fam, s=20)
    for row, m in markers.items():
        ax.scatter([], [], marker=m, color="gray", label=row, s=20)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("weight GB streamed per step (log)")
    ax.set_ylabel("ms per step (log)")
    ax.set_title("roofline: weight families vs the copy ceiling", fontsize=9)
    ax.legend(fontsize=6)
    return True
