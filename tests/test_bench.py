"""`dsv4-audit bench` on the CPU: eager rows timed, graph rows marked as needing CUDA, reports written."""

from __future__ import annotations

import json

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
    from audit.bench import bench

    seen = []
    res = bench("tiny", modes=("eager", "full"), steps=2, batches=(1,), contexts=(20, 30), device="cpu",
                on_row=lambda partial: seen.append(len(partial.rows)))
    assert seen == [1, 2, 3, 4] and len(res.rows) == 4


def test_kernel_profile_counts_what_a_step_runs(rng):
    """The breakdown the full rows carry, exercised on the CPU's leaf ops: per-step counts add up."""
    from audit.bench_profile import kernel_profile

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
    from audit import bench_profile
    from audit.bench_report import markdown
    from audit.bench_result import BenchResult, ModeResult
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
