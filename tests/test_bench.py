"""`dsv4-audit bench` on the CPU: eager rows timed, graph rows marked as needing CUDA, reports written."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch
from typer.testing import CliRunner

from cli import app

runner = CliRunner()


def test_bench_cli_on_tiny_cpu(tmp_path):
    r = runner.invoke(app, ["bench", "--preset", "tiny", "--device", "cpu", "--steps", "4", "--batch", "1,2",
                            "--context", "32,300", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "graph modes" in r.output and "need CUDA" in r.output
    data = json.loads((tmp_path / "bench-tiny.json").read_text())
    rows = data["rows"]
    assert {(x["mode"], x["batch"], x["context"]) for x in rows} == {
        (m, b, c) for m in ("eager", "ab", "full", "compile") for b in (1, 2) for c in (32, 300)}
    for x in rows:
        if x["mode"] == "eager":
            assert x["ms_median"] > 0 and x["ms_p10"] <= x["ms_median"] <= x["ms_p90"]
            assert x["tokens_per_s"] > 0
        else:
            assert x["ms_median"] is None and "CUDA" in x["note"]
    assert data["weight_bytes"]["2"] > data["weight_bytes"]["1"] > 0
    md = (tmp_path / "bench-tiny.md").read_text()
    assert "| eager | 2 | 300 |" in md
    assert (tmp_path / "bench-tiny.png").stat().st_size > 1000
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left behind


def test_bench_refuses_bad_input_in_one_line(tmp_path):
    for args, words in ((["--context", "5000"], "does not fit"), (["--modes", "eager,fast"], "unknown bench mode"),
                        (["--batch", "0"], "must be positive"), (["--batch", "x"], "comma-separated")):
        r = runner.invoke(app, ["bench", "--preset", "tiny", "--device", "cpu", "--out", str(tmp_path), *args])
        assert r.exit_code == 2, (args, r.output)
        assert words in r.output and "Traceback" not in r.output
        assert sum(line.startswith("error:") for line in r.output.splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_bench_append_merges_runs_and_saves_after_every_row(tmp_path):
    base = ["bench", "--preset", "tiny", "--device", "cpu", "--steps", "3", "--modes", "eager", "--out", str(tmp_path)]
    assert runner.invoke(app, base + ["--context", "40"]).exit_code == 0
    first = json.loads((tmp_path / "bench-tiny.json").read_text())["rows"][0]
    r = runner.invoke(app, base + ["--context", "40,90", "--append"])
    assert r.exit_code == 0, r.output
    rows = json.loads((tmp_path / "bench-tiny.json").read_text())["rows"]
    assert sorted(x["context"] for x in rows) == [40, 90]  # the 40 row was measured again: replaced
    assert [x for x in rows if x["context"] == 40][0]["ms_median"] != first["ms_median"]
    r = runner.invoke(app, base + ["--dtype", "float32", "--append"])
    assert r.exit_code == 2 and "cannot merge" in r.output


def test_bench_reports_each_row_as_it_lands():
    from audit.bench.run import bench

    seen = []
    res = bench("tiny", modes=("eager", "full"), steps=2, batches=(1,), contexts=(20, 30), device="cpu",
                on_row=lambda partial: seen.append(len(partial.rows)))
    assert seen == [1, 2, 3, 4] and len(res.rows) == 4


def test_kernel_profile_counts_what_a_step_runs(rng):
    """The breakdown the full rows carry, exercised on the CPU's leaf ops: per-step counts add up."""
    from audit.bench.profile import kernel_profile

    a, b = torch.randn(64, 64, generator=rng), torch.randn(64, 64, generator=rng)

    def step():
        for _ in range(3):
            torch.mm(a, b)
        torch.sigmoid(a)

    rows = kernel_profile(step, steps=4, cuda=False)
    names = {r["kernel"]: r for r in rows[1:]}
    assert names["aten::mm"]["per_step"] == 3 and names["aten::sigmoid"]["per_step"] == 1
    assert rows[0]["per_step"] == sum(r["per_step"] for r in rows[1:])
    assert rows[0]["us_per_step"] >= names["aten::mm"]["us_per_step"] > 0


def test_layer_graph_profile_covers_every_layer_with_its_tags(monkeypatch, tmp_path):
    """The per-layer graph breakdown's plumbing on the CPU: capture is stood in by the eager call and
    the event timer by a counter, so each layer must be run `reps` times and tagged right."""
    import types

    import dsv4
    from audit.bench import profile as bench_profile
    from audit.bench.report import markdown
    from audit.bench.result import BenchResult, ModeResult
    from dsv4.decode.graph import CUDAGraphDecoder
    from dsv4.kernels import bench as kbench

    model = dsv4.load("tiny", dtype="float32")
    dec = CUDAGraphDecoder(model, mode="eager", batch_size=1)
    dec.prefill(torch.randint(0, 1024, (1, 5)))
    calls = []

    def fake_capture(device, fn):
        return types.SimpleNamespace(replay=lambda: calls.append(fn().shape)), fn()

    monkeypatch.setattr(dec, "_capture", fake_capture)
    monkeypatch.setattr(kbench, "event_times", lambda run, reps: [run() or 0.5 for _ in range(reps)])
    rows = bench_profile.layer_graph_profile(dec, reps=3)
    assert [(r["ratio"], r["routing"]) for r in rows] == [(0, "hash"), (4, "hash"), (128, "learned"), (4, "learned")]
    assert len(calls) == 4 * 3 and all(s == (1, 1, 4, 256) for s in calls) and all(r["ms"] == 0.5 for r in rows)
    res = BenchResult("tiny", "cpu", 4, "float32", 1, None, rows=[ModeResult("full", 1, 8, per_layer=rows)])
    assert "| 128 | learned | 1 | 0.500 | 0.50 |" in markdown(res, None)


def _synthetic(rng, rows):
    from audit.bench.result import BenchResult, ModeResult

    res = BenchResult("flash-h200", "gpu", 43, "bfloat16", 8, copy_tb_s=4.0,
                      weight_bytes={"1": 10e9, "4": 16e9})  # floors: 2.5 ms and 4 ms
    for mode, b, c, ms in rows:
        res.rows.append(ModeResult(mode, b, c, steps=8, ms_median=ms, ms_p10=ms * 0.9, ms_p90=ms * 1.1,
                                   tokens_per_s=b * 1e3 / ms))
    return res


def test_report_judges_the_targets_from_the_rows(rng):
    """The targets table follows the measured figures: each verdict flips when its figure crosses."""
    from audit.bench.report import markdown

    for _ in range(4):
        full = 2.5 * (0.5 + 3 * torch.rand((), generator=rng).item())  # around 2x the 2.5 ms floor
        eager = full * (2 + 12 * torch.rand((), generator=rng).item())
        comp = full * (0.5 + torch.rand((), generator=rng).item())
        md = markdown(_synthetic(rng, [("eager", 1, 1024, eager), ("full", 1, 1024, full),
                                       ("compile", 1, 1024, comp), ("full", 4, 1024, 3 * full)]), None)
        verdict = {line.split(" | ")[0][2:]: line.rstrip(" |").split(" | ")[-1]
                   for line in md.splitlines() if line.startswith("| graph decode")}
        assert verdict["graph decode within 2x the bandwidth floor"] == ("yes" if full <= 5.0 else "**no**")
        assert verdict["graph decode at least 8x faster than eager"] == ("yes" if eager >= 8 * full else "**no**")
        assert verdict["graph decode faster than torch.compile reduce-overhead"] == ("yes" if full < comp else "**no**")
        assert f"full graph {full:.2f} ms/token" in md


def test_report_scaling_table_names_the_fastest_mode(rng):
    from audit.bench.report import markdown

    ms = {(m, b, c): float(1 + 100 * torch.rand((), generator=rng)) for m in ("eager", "full")
          for b in (1, 4) for c in (64, 512)}
    md = markdown(_synthetic(rng, [(m, b, c, v) for (m, b, c), v in ms.items()]), None)
    lines = [line for line in md.split("## Scaling")[1].splitlines() if line.startswith(("| 1 |", "| 4 |"))]
    assert len(lines) == 4
    for line in lines:
        cells = [x.strip() for x in line.strip("|").split("|")]
        b, c = int(cells[0]), int(cells[1])
        fastest = min(("eager", "full"), key=lambda m: ms[(m, b, c)])
        assert cells[4] == fastest and cells[2] == f"{ms[('eager', b, c)]:.2f}" and cells[3] == f"{ms[('full', b, c)]:.2f}"


def test_kernel_families_partition_the_profiled_step(rng):
    """Every kernel lands in one family; a profile cut to its top kernels keeps the rest as one line."""
    from audit.bench.profile import families

    names = ["_bf16_gemv_kernel", "kernel_cutlass_fp8_kernel_x", "kernel_cutlass_fp4_grouped_kernel_y",
             "triton_poi_fused_add_div_sum_3", "void at::native::sbtopk::gatherTopK<float>",
             "sm80_xmma_gemm_f32f32", "void at::native::elementwise_kernel<128>", "_split_out"]
    rows = [{"kernel": n, "per_step": float(torch.randint(1, 50, (), generator=rng)),
             "us_per_step": float(torch.rand((), generator=rng) * 100)} for n in names]
    total = {"kernel": "(all)", "per_step": sum(r["per_step"] for r in rows),
             "us_per_step": sum(r["us_per_step"] for r in rows)}
    fam = families([total] + rows)
    assert len(fam) == len(names) and "not itemized" not in fam
    assert fam["FP8 weights (CuTe GEMV, Triton GEMM)"]["us_per_step"] == rows[1]["us_per_step"]
    assert fam["layer kernels (Triton: mHC, attention, top-k)"]["us_per_step"] == rows[-1]["us_per_step"]
    # the Triton weight kernels join their formats' families
    both = families([total, {**rows[1], "kernel": "_fp8_gemm_kernel"}, {**rows[2], "kernel": "_experts_kernel"}])
    assert {"FP8 weights (CuTe GEMV, Triton GEMM)", "FP4 experts (CuTe, Triton)"} <= set(both)
    # an inductor kernel fused around a custom op carries the op's name: it stays with inductor
    fused = families([total, {**rows[0], "kernel": "triton_red_fused__to_copy_add_bf16_gemv_mean_2"}])
    assert set(fused) - {"not itemized"} == {"inductor-fused pointwise/reductions"}
    assert abs(sum(f["us_per_step"] for f in fam.values()) - total["us_per_step"]) < 1e-6
    cut = families([total] + rows[:3])
    assert abs(cut["not itemized"]["us_per_step"] - sum(r["us_per_step"] for r in rows[3:])) < 1e-6


def test_every_launched_triton_kernel_of_ours_has_a_family():
    """Each Triton kernel dsv4/kernels launches (a jit function called with a grid) lands in a named
    family, not in "other": a new kernel must join the table, or its time reads as stray ATen copies."""
    import ast

    from audit.bench.profile import families

    def is_jit(f):
        return any("jit" in ast.unparse(d) for d in f.decorator_list)

    root = Path(__file__).resolve().parent.parent / "dsv4" / "kernels"
    launched = set()
    for path in root.glob("_triton_*.py"):
        tree = ast.parse(path.read_text())
        jit = {f.name for f in tree.body if isinstance(f, ast.FunctionDef) and is_jit(f)}
        host = [f for f in tree.body if not (isinstance(f, ast.FunctionDef) and is_jit(f))]
        launched |= {n.id for f in host for n in ast.walk(f) if isinstance(n, ast.Name) and n.id in jit}
    assert {"_entry_kernel", "_token_kernel", "_comb_kernel", "_split_sum"} <= launched
    for name in launched:
        row = {"kernel": name, "per_step": 1.0, "us_per_step": 1.0}
        fam = families([{"kernel": "(all)", "per_step": 1.0, "us_per_step": 1.0}, row])
        assert "other (ATen, copies)" not in fam, name

def test_bench_rows_carry_their_commit_and_copy_ceiling(monkeypatch):
    from audit.bench import run as bench_mod

    real = bench_mod.source_commit()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(bench_mod.__file__).parent,
                          capture_output=True, text=True, check=False).stdout.strip()
    assert real.removesuffix("+dirty") == head  # "" outside a git checkout, on both sides
    monkeypatch.setattr(bench_mod, "source_commit", lambda: "abc1234+dirty")
    res = bench_mod.bench("tiny", modes=("eager",), steps=2, batches=(1,), contexts=(20,), device="cpu")
    assert [r.commit for r in res.rows] == ["abc1234+dirty"] and res.rows[0].copy_tb_s is None


def test_roofline_puts_each_weight_family_against_the_copy_ceiling(tmp_path, rng):
    """A profiled row's weight families get bytes from bytes_by_kind and TB/s = bytes / time; families
    without weights are listed without bytes; the figure gains the roofline panel."""
    from audit.bench import roofline
    from audit.bench.report import write_reports
    from audit.bench.result import BenchResult, ModeResult

    us = [float(v) for v in torch.rand(3, generator=rng) * 1000 + 100]
    kernels = [{"kernel": "(all)", "per_step": 6.0, "us_per_step": sum(us)},
               {"kernel": "kernel_cutlass_fp8_kernel_a", "per_step": 2.0, "us_per_step": us[0]},
               {"kernel": "_bf16_gemv_kernel", "per_step": 2.0, "us_per_step": us[1]},
               {"kernel": "triton_poi_fused_add_0", "per_step": 2.0, "us_per_step": us[2]}]
    row = ModeResult("full", 1, 64, steps=4, ms_median=sum(us) / 1e3, ms_p10=1, ms_p90=1, tokens_per_s=1,
                     kernels=kernels, copy_tb_s=4.0)
    fp8, bf16 = int(torch.randint(1 << 28, 1 << 32, (), generator=rng)), int(torch.randint(1 << 28, 1 << 30, (), generator=rng))
    res = BenchResult("tiny", "test", 2, "bfloat16", 4, 4.0, weight_bytes={"1": fp8 + bf16},
                      bytes_by_kind={"1": {"fp8": fp8, "bf16": bf16, "experts": 0, "other": 0}}, rows=[row])
    pts = {p["family"]: p for p in roofline.points(res)}
    f8 = pts["FP8 weights (CuTe GEMV, Triton GEMM)"]
    assert abs(f8["tb_s"] - fp8 / (us[0] * 1e-6) / 1e12) < 1e-9 and abs(f8["pct"] - 100 * f8["tb_s"] / 4.0) < 1e-9
    assert abs(pts["bf16 GEMV (Triton)"]["floor_us"] - bf16 / 4e12 * 1e6) < 1e-6
    assert pts["inductor-fused pointwise/reductions"]["bytes"] is None
    md = "\n".join(roofline.markdown(res))
    assert "## Roofline" in md and "- (no weights)" in md and f"{f8['pct']:.0f}%" in md
    paths = write_reports(res, tmp_path)
    assert any(p.suffix == ".png" for p in paths) and "## Roofline" in paths[0].read_text()
    assert "| kernels per layer (all / layers) | 3.0 |" in paths[0].read_text()  # 6 kernels over 2 layers


def test_bench_collects_library_warnings_into_the_report_not_the_terminal(tmp_path, monkeypatch, rng):
    """A warning raised while a row runs (inductor and the profiler raise several on a GPU) is not
    printed: it lands once in the report's warnings section, with where it came from."""
    import warnings

    from audit.bench import run as bench_mod

    token = f"decode warning {int(torch.randint(1 << 30, (), generator=rng))}"
    real = bench_mod._row

    def noisy_row(*args, **kwargs):
        for _ in range(3):
            warnings.warn(token, UserWarning)
        return real(*args, **kwargs)

    monkeypatch.setattr(bench_mod, "_row", noisy_row)
    r = runner.invoke(app, ["bench", "--preset", "tiny", "--device", "cpu", "--steps", "2", "--modes", "eager",
                            "--context", "32", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert token not in r.output
    md = (tmp_path / "bench-tiny.md").read_text()
    assert "## Warnings raised during the run" in md and md.count(token) == 1
    assert json.loads((tmp_path / "bench-tiny.json").read_text())["warnings"] == [
        f"UserWarning: {token} (test_bench.py:{noisy_row.__code__.co_firstlineno + 2})"]


def test_full_rows_are_profiled_only_after_every_row_is_timed(monkeypatch):
    """torch.profiler (CUPTI) slows every later graph replay of the process, so the bench times all its
    rows first and profiles the full rows after. CUDA is stood in for: the rows' timing and profiling
    are recorded, not run."""
    import random

    import dsv4
    from audit.bench import run as bench_run
    from audit.bench.result import ModeResult

    calls = []

    def fake_time(model, mode, batch, ctx, *a, **k):
        calls.append(("time", mode, batch, ctx, model.cfg.max_seq_len))
        return ModeResult(mode, batch, ctx, ms_median=1.0, fused=mode == "full")

    def fake_profile(model, row, rng):
        calls.append(("profile", row.mode, row.batch, row.context, model.cfg.max_seq_len))
        row.kernels = [{"kernel": "(all)", "per_step": 1, "us_per_step": 1.0}]

    real_load = dsv4.load
    monkeypatch.setattr(dsv4, "load", lambda preset, device=None, **kw: real_load("tiny", **kw))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stand-in")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(bench_run, "copy_bandwidth", lambda dev: 1.0)
    monkeypatch.setattr(bench_run, "per_layer_profile", lambda model, batch: [])
    monkeypatch.setattr(bench_run, "run_mode", fake_time)
    monkeypatch.setattr(bench_run, "profile_row", fake_profile)
    contexts = sorted(random.sample(range(16, 200), 2))
    modes = ("eager", "full", "compile")
    res = bench_run.bench("tiny", modes=modes, steps=2, batches=(1, 2), contexts=contexts, device="cuda",
                          kernels=False, isolate=False)  # in one process (tests/test_bench_isolate.py: one per group)
    kinds = [c[0] for c in calls]
    assert kinds == ["time"] * 12 + ["profile"] * 4, kinds  # every timing, then every profile
    profiled = {c[1:] for c in calls if c[0] == "profile"}
    timed = {c[1:] for c in calls if c[0] == "time" and c[1] == "full"}
    assert profiled == timed  # each full row once, with the cache sized for its own context
    assert all(r.kernels for r in res.rows if r.mode == "full") and not any(r.kernels for r in res.rows
                                                                             if r.mode != "full")
