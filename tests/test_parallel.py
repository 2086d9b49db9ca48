"""Tensor-parallel decode and per-rank scans on the CPU: gloo, two ranks, loopback only.

Each launch starts one process per rank the way torchrun would (RANK, WORLD_SIZE, LOCAL_RANK),
with a file:// rendezvous store instead of a TCP one and gloo pinned to `lo`, so nothing listens
on or talks to any address but 127.0.0.1. Weights, prompts and lengths are drawn fresh every run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import dsv4
from dsv4.config import preset
from dsv4.decode.parallel import LocalExperts, check_world, held_bytes, plan, shard_, shared_split
from dsv4.errors import DSV4Error

REPO = Path(__file__).resolve().parent.parent
LAUNCH_TIMEOUT = 120


def launch(world: int, argv: list[str], tmp_path: Path, tag: str) -> list[subprocess.CompletedProcess]:
    """Runs `python argv...` as ranks 0..world-1 of one group; kills them (by pid) past the timeout."""
    store = tmp_path / f"store-{tag}"
    env = dict(os.environ, WORLD_SIZE=str(world), DIST_INIT_METHOD=f"file://{store}", GLOO_SOCKET_IFNAME="lo",
               MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, *argv], cwd=REPO, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(world)]
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    out = []
    try:
        for r, p in enumerate(procs):
            so, se = p.communicate(timeout=max(deadline - time.monotonic(), 1))
            out.append(subprocess.CompletedProcess(p.args, p.returncode, so, se))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{tag}: ranks did not finish within {LAUNCH_TIMEOUT} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return out


def _seed() -> int:
    return int.from_bytes(os.urandom(3), "little")


# ---------------------------------------------------------------------- decode across ranks
@pytest.mark.parametrize("decoder", ["reference", "eager"])
def test_tp_decode_matches_the_unsharded_model(tmp_path, rng, decoder):
    """Float32 logits of 2 gloo ranks vs one unsharded model over >= 40 steps that cross ratio-4
    and ratio-128 emissions and wrap the 16-slot window (eager = the graph-ready static path)."""
    seed, prompt = _seed(), int(torch.randint(90, 100, (1,), generator=rng))
    steps = 128 - prompt + int(torch.randint(14, 20, (1,), generator=rng))
    res = launch(2, ["-m", "dsv4.decode.tp_run", "--preset", "tiny", "--dtype", "float32", "--decoder", decoder,
                     "--steps", str(steps), "--prompt-len", str(prompt), "--seed", str(seed), "--json",
                     str(tmp_path / "res")] + (["--verify", "2"] if decoder == "eager" else []), tmp_path, decoder)
    assert [r.returncode for r in res] == [0, 0], \
        f"seed {seed}, prompt {prompt}, steps {steps}\n" + res[0].stdout + res[0].stderr + res[1].stderr
    r0, r1 = (json.loads((tmp_path / "res" / f"rank{r}.json").read_text()) for r in (0, 1))
    check = r0["check"]
    pos = [c["pos"] for c in check]
    assert len(check) == steps >= 40 and 127 in pos and min(pos) >= 16  # ratio 128 emits at 127; window wrapped
    assert any((p + 1) % 4 == 0 for p in pos)
    worst = max(c["rel_diff"] for c in check)
    assert worst <= 1e-5, [c for c in check if c["rel_diff"] > 1e-5][:3]
    assert r0["tokens"] == r1["tokens"] and r0["decoder"] == r1["decoder"] == decoder
    if decoder == "eager":  # the replay check's plumbing (graphs need CUDA): same tokens, AND over ranks
        assert r0["verify"]["steps"] == 2 and r0["verify"]["ok_all_ranks"] and r1["verify"]["ok_all_ranks"]
    # each rank really holds less: its experts, its heads, not views of the full tensors
    assert r0["bytes_full"] == r1["bytes_full"]
    for r in (r0, r1):
        assert r["bytes_rank"] < 0.85 * r["bytes_full"], r
    assert (r0["experts"], r1["experts"]) == ([0, 4], [4, 8]) and (r0["heads"], r1["heads"]) == ([0, 2], [2, 4])
    assert "max rel diff vs the unsharded model" in res[0].stdout and "tokens/s" in res[0].stdout


# ---------------------------------------------------------------------- sharding, in process
def _identity(t):
    return t


def test_shard_keeps_exactly_its_slice_and_frees_the_rest(rng):
    seed = int(torch.randint(0, 2**31, (1,), generator=rng))
    full = dsv4.load("tiny", dtype="float32", seed=seed)
    keys = full.state_dict()
    shards = []
    for rank in (0, 1):
        m = dsv4.load("tiny", dtype="float32", seed=seed)
        s = shard_(m, rank, 2, reduce=_identity)
        shards.append(m)
        sd = m.state_dict()
        assert set(sd) <= set(keys)  # the released names, a subset of them
        assert held_bytes(m) < 0.85 * held_bytes(full)
        for i in torch.randint(0, 4, (2,), generator=rng).tolist():
            a, fa = m.layers[i].attn, full.layers[i].attn
            h = slice(s.heads.start * 128, s.heads.stop * 128)
            g = slice(s.groups.start * 128, s.groups.stop * 128)
            assert torch.equal(a.wq_b.dequantized(), fa.wq_b.dequantized()[h])
            assert torch.equal(a.wo_a.dequantized(), fa.wo_a.dequantized()[g])
            assert torch.equal(a.wo_b.dequantized(), fa.wo_b.dequantized()[:, g])
            assert torch.equal(a.attn_sink, fa.attn_sink[s.heads.start:s.heads.stop])
            assert torch.equal(a.wkv.weight.float(), fa.wkv.weight.float())  # the shared KV head stays whole
            ffn = m.layers[i].ffn
            assert isinstance(ffn.experts, LocalExperts) and list(ffn.expert_ids) == list(s.experts)
            e = int(torch.randint(s.experts.start, s.experts.stop, (1,), generator=rng))
            assert torch.equal(ffn.experts[e].w2.dequantized(), full.layers[i].ffn.experts[e].w2.dequantized())
            assert (ffn.shared_experts is not None) == (i % 2 == rank)  # tiny: 128 wide, kept whole on one rank
        # no view keeps a full tensor alive: the storages are exactly the kept elements
        for name, p in m.named_parameters():
            assert p.untyped_storage().nbytes() == p.numel() * p.element_size(), name
    experts = [{k.split(".experts.")[1].split(".")[0] for k in sh.state_dict() if ".experts." in k} for sh in shards]
    assert experts[0].isdisjoint(experts[1]) and len(experts[0] | experts[1]) == 8
    with pytest.raises(DSV4Error, match="already sharded"):
        shard_(shards[0], 0, 2, reduce=_identity)


def test_shared_expert_splits_where_blocks_allow():
    flash = preset("flash")
    for world in (2, 4, 8):
        check_world(flash, world)
        assert shared_split(flash, world)  # 2048 / world stays a multiple of 128
        s = plan(flash, world - 1, world)
        assert len(s.heads) == 64 // world and s.experts.stop == 256
    assert not shared_split(preset("tiny"), 2)
    m = dsv4.load("tiny", dtype="float32", seed=0, moe_inter_dim=256)
    shard_(m, 1, 2, reduce=_identity)
    sh = m.layers[0].ffn.shared_experts
    assert (sh.w1.out_features, sh.w3.out_features, sh.w2.in_features) == (128, 128, 128)
    assert tuple(sh.w1.scale.shape) == (1, 2) and tuple(sh.w2.scale.shape) == (2, 1)


@pytest.mark.parametrize("cfg_kw, world, needle", [
    ({}, 3, "o_groups=2"),
    ({}, 4, "o_groups=2"),
    ({"o_groups": 4, "n_routed_experts": 6}, 4, "n_routed_experts=6"),
    ({"o_lora_rank": 64}, 2, "multiple of the 128-wide fp8 blocks"),
    ({}, 0, "positive integer"),
])
def test_bad_world_sizes_are_one_dsv4_error_line(cfg_kw, world, needle):
    cfg = preset("tiny", **cfg_kw)
    with pytest.raises(DSV4Error) as e:
        check_world(cfg, world)
    assert needle in str(e.value) and "\n" not in str(e.value)
    if world:
        with pytest.raises(DSV4Error, match="o_groups|n_routed|blocks"):
            shard_(dsv4.load("tiny", dtype="float32", seed=0, **cfg_kw), 0, world, reduce=_identity)


def test_launcher_and_scan_refuse_bad_world_sizes_before_the_rendezvous(monkeypatch, capsys, tmp_path):
    from typer.testing import CliRunner

    from cli import app
    from dsv4.decode import tp_run

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("DIST_INIT_METHOD", f"file://{tmp_path / 'never'}")
    assert tp_run.main(["--preset", "tiny", "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: tensor parallel over 3 ranks") and "\n" not in err
    res = CliRunner().invoke(app, ["scan", "--device", "cpu", "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and "o_groups=2" in res.output and "Traceback" not in res.output, res.output
    res = CliRunner().invoke(app, ["scan", "--tp", "2", "--device", "cpu", "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and "torchrun started 3" in res.output, res.output
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    res = CliRunner().invoke(app, ["scan", "--tp", "2", "--device", "cpu", "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and "torchrun --nproc-per-node 2" in res.output, res.output
    assert not (tmp_path / "never").exists() and not (tmp_path / "s").exists()


# ---------------------------------------------------------------------- per-rank scans
def test_merge_names_the_ranks_of_each_finding(rng):
    from audit import ranks
    from audit.report import writers as report
    from audit.report.inventory import Finding, Inventory

    line = int(torch.randint(10, 90, (1,), generator=rng))
    base = {"category": "host-sync", "file": "dsv4/x.py", "line": line, "function": "f", "module": "m",
            "op": "aten.nonzero", "message": "reads a size"}
    only1 = dict(base, category="baked-host-value", line=line + 3, op="aten.select", message="baked")
    r0 = ranks.tag(Inventory.from_findings([Finding(severity="blocks-capture", count_per_step=1, **base)],
                                           {"target": "t", "traced_ops": 5}), 0, 2)
    r1 = ranks.tag(Inventory.from_findings([Finding(severity="blocks-capture", count_per_step=2, **base),
                                            Finding(severity="silent-corruption", count_per_step=1, **only1)],
                                           {"target": "t", "traced_ops": 7}), 1, 2)
    assert {f["rank"] for f in r1.findings()} == {1}
    merged = ranks.merge([r0, r1])
    by_line = {f["line"]: f for f in merged.findings()}
    assert by_line[line]["rank"] == "0,1" and by_line[line]["count_per_step"] == 2
    assert by_line[line + 3]["rank"] == "1" and merged.meta["ranks"] == 2 and merged.meta["traced_ops"] == 12
    md = report.markdown(merged)
    assert "| rank(s) |" in md and f"x.py:{line + 3}` (f) | `aten.select` | 1 | silent-corruption | 1 |" in md
    assert "| rank(s) |" not in report.markdown(r1) and "this is rank 1 of 2" in report.markdown(r1)


def test_scan_per_rank_writes_rank_inventories_and_a_merged_one(tmp_path):
    """`dsv4-audit scan --tp 2` on two gloo ranks: the sharded static path stays graph-ready."""
    out = tmp_path / "scan"
    res = launch(2, ["-m", "cli", "scan", "--target", "dsv4:tiny", "--path", "static", "--tp", "2", "--device",
                     "cpu", "--steps", "2", "--warmup", "1", "--out", str(out)], tmp_path, "scan")
    assert [r.returncode for r in res] == [0, 0], res[0].stdout + res[0].stderr + res[1].stderr
    for r in (0, 1):
        data = json.loads((out / f"rank{r}" / "inventory.json").read_text())
        assert data["summary"]["rank"] == r and data["summary"]["tp"] == 2 and data["findings"]
        assert {f["rank"] for f in data["findings"]} == {r}
        assert (out / f"rank{r}" / "inventory.md").is_file()
    merged = json.loads((out / "inventory.json").read_text())
    assert merged["summary"]["ranks"] == 2 and "tensor parallel over 2 ranks" in merged["summary"]["target"]
    assert all(f["rank"] in ("0", "1", "0,1") for f in merged["findings"])
    assert not [f for f in merged["findings"] if f["severity"] in ("blocks-capture", "silent-corruption")]
    md = (out / "inventory.md").read_text()
    rows = [ln for ln in md.splitlines() if ln.startswith("| `")]
    assert rows and "| rank(s) |" in md and all("| 0,1 |" in ln or "| 0 |" in ln or "| 1 |" in ln for ln in rows)
    assert "inventory.md" in res[0].stdout and not res[1].stdout.strip()
