"""Tensor-parallel decode launcher: `torchrun --nproc-per-node W -m dsv4.decode.tp_run --preset tiny`.

Every rank loads the same seeded model, shards it (dsv4/decode/parallel.py), prefills the same
random prompt (drawn from a seed every rank shares, so nothing is sent) and decodes greedily; the
next token is broadcast from rank 0 each step so no rank can drift onto another sequence, which
would desynchronise the collectives. Backend: NCCL on CUDA (one GPU per rank, cuda:LOCAL_RANK),
gloo on the CPU. Decoders: `reference` (the model's own decode), `eager` (the static path), `ab`
and `full` (CUDAGraphDecoder, one set of graphs per rank, all-reduces captured inside).

--verify N first replays N steps of the graphs bitwise against the eager static path on every
rank (the issue's replay check, per rank). Rank 0 then replays the same tokens through an
unsharded model and prints, per step, the relative difference of the float32 logits
(max |tp - full| / max |full|), plus decode tokens/s of both.
Exit 1 if --tol is exceeded; bad input (a world size the model cannot be split over, ...) is one
line and exit 2, before any rendezvous.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import dsv4
from dsv4.config import preset as preset_config
from dsv4.decode.parallel import (
    check_world,
    dist_env,
    held_bytes,
    init_distributed,
    rank_device,
    shard_,
    shutdown_distributed,
)
from dsv4.errors import DSV4Error

DECODERS = ("reference", "eager", "ab", "full")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dsv4.decode.tp_run", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny", help="tiny | flash | pro | flash-h200")
    p.add_argument("--steps", type=int, default=32, help="decode steps")
    p.add_argument("--prompt-len", type=int, default=8, help="length of the random prompt")
    p.add_argument("--dtype", default="float32", help="float32 (exact math, checked) | bfloat16")
    p.add_argument("--decoder", default=None, help="reference | eager | ab | full (default: full on CUDA, else eager)")
    p.add_argument("--seed", type=int, default=0, help="weights and prompt (the same on every rank)")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda if available); cuda -> cuda:LOCAL_RANK")
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the unsharded comparison on rank 0")
    p.add_argument("--tol", type=float, default=None, help="max relative logit difference (default 1e-5 in float32)")
    p.add_argument("--verify", type=int, default=0, metavar="N",
                   help="first replay N steps bitwise against the eager static path on every rank (ab, full)")
    p.add_argument("--json", type=Path, default=None, help="directory for per-rank results rank{r}.json")
    return p.parse_args(argv)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _runner(model, decoder: str):
    """An object with prefill(tokens) and decode(ids) for the chosen decoder."""
    if decoder == "reference":
        return model
    from dsv4.decode.graph import CUDAGraphDecoder

    return CUDAGraphDecoder(model, mode=decoder)


@torch.no_grad()
def tp_decode(args, env, device) -> dict:
    """This rank's share of the run: load, shard, prefill, decode; rank 0 keeps the logits."""
    import torch.distributed as dist

    model = dsv4.load(args.preset, device=device, dtype=args.dtype, seed=args.seed)
    full_bytes = held_bytes(model)
    shard = shard_(model, env.rank, env.world)
    out = {"rank": env.rank, "world": env.world, "device": str(device), "decoder": args.decoder,
           "bytes_full": full_bytes, "bytes_rank": held_bytes(model),
           "experts": [shard.experts.start, shard.experts.stop], "heads": [shard.heads.start, shard.heads.stop]}
    gen = torch.Generator().manual_seed(args.seed + 1)  # the shared seed: the same prompt on every rank
    prompt = torch.randint(0, model.cfg.vocab_size, (1, args.prompt_len), generator=gen)
    runner = _runner(model, args.decoder)
    if args.verify:
        out["verify"] = verify_all_ranks(runner, args, env, device)
    logits = runner.prefill(prompt.to(device))
    nxt = logits.argmax(-1)
    tokens, kept = [], []  # kept on the device until the timed loop is over
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        if env.world > 1:
            dist.broadcast(nxt, src=0)
        tokens.append(nxt)
        logits = runner.decode(nxt)
        if env.rank == 0:
            kept.append(logits.float().clone())  # the graph decoder returns the same buffer every step
        nxt = logits.argmax(-1)
    _sync(device)
    out["decode_s"] = time.perf_counter() - t0
    out["prompt"], out["tokens"] = prompt[0].tolist(), [int(t[0]) for t in tokens]
    return out | {"_logits": [k.cpu() for k in kept]}


def verify_all_ranks(runner, args, env, device) -> dict:
    """verify_replay on every rank with the same seed (same tokens everywhere, so the collectives
    sum matching partials); the verdict is the AND over ranks."""
    import torch.distributed as dist

    from dsv4.decode.verify import verify_replay

    res = verify_replay(runner, steps=args.verify, seed=args.seed + 2)
    ok = torch.tensor([int(res.ok)], device=device)
    if env.world > 1:
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return {"steps": res.steps, "ok_this_rank": res.ok, "ok_all_ranks": bool(ok.item()),
            "first_mismatch": res.first_mismatch}


@torch.no_grad()
def check_unsharded(args, device, res: dict) -> list[dict]:
    """The same prompt and tokens through one unsharded model (reference path); per-step rel diff."""
    model = dsv4.load(args.preset, device=device, dtype=args.dtype, seed=args.seed)
    model.prefill(torch.tensor([res["prompt"]], device=device))
    rows = []
    t_total = 0.0
    for i, (tok, tp) in enumerate(zip(res["tokens"], res["_logits"])):
        _sync(device)
        t0 = time.perf_counter()
        full = model.decode(torch.tensor([tok], device=device)).float().cpu()
        _sync(device)
        t_total += time.perf_counter() - t0
        rel = ((tp - full).abs().max() / full.abs().max().clamp_min(1e-30)).item()
        rows.append({"step": i, "pos": len(res["prompt"]) + i, "token": tok, "rel_diff": rel,
                     "argmax_equal": bool(tp.argmax() == full.argmax())})
    res["unsharded_decode_s"] = t_total
    return rows


def report(args, res: dict, rows: list[dict], tol: float | None) -> bool:
    """Rank 0's printout; True when within tolerance."""
    w = res["world"]
    print(f"tp decode: {args.preset} {args.dtype}, {w} rank(s), decoder {args.decoder}, device {res['device']}")
    print(f"rank 0 holds {res['bytes_rank'] / 2**20:.2f} MiB of {res['bytes_full'] / 2**20:.2f} MiB "
          f"({res['bytes_rank'] / res['bytes_full']:.0%}); experts {res['experts'][0]}..{res['experts'][1] - 1}")
    ok = True
    if "verify" in res:
        v = res["verify"]
        ok = v["ok_all_ranks"]
        verdict = "bitwise equal to eager on every rank" if ok else \
            f"DIFFERS ({v['first_mismatch'] or 'on another rank'})"
        print(f"verify: {v['steps']} steps, graph ({args.decoder}) replay {verdict}")
    if rows:
        print(f"{'step':>5} {'pos':>5} {'token':>6} {'rel diff':>10}  argmax")
        for r in rows:
            print(f"{r['step']:>5} {r['pos']:>5} {r['token']:>6} {r['rel_diff']:>10.2e}  "
                  f"{'same' if r['argmax_equal'] else 'DIFFERS'}")
        worst = max(r["rel_diff"] for r in rows)
        ok = ok and (tol is None or worst <= tol)
        verdict = "" if tol is None else (" (within" if ok else " (EXCEEDS") + f" tol {tol:g})"
        print(f"max rel diff vs the unsharded model over {len(rows)} steps: {worst:.2e}{verdict}")
    n = len(res["tokens"])
    print(f"decode: {n} steps in {res['decode_s']:.3f} s = {n / max(res['decode_s'], 1e-9):.1f} tokens/s "
          f"(tp {w})" + (f"; unsharded reference {n / max(res['unsharded_decode_s'], 1e-9):.1f} tokens/s"
                         if "unsharded_decode_s" in res else ""))
    return ok


def main(argv=None) -> int:
    args = parse(argv)
    try:
        env = dist_env()
        cfg = preset_config(args.preset, dtype=args.dtype)  # validates preset and dtype
        check_world(cfg, env.world)  # before the rendezvous: every rank fails alike, nobody waits
        if args.steps < 1 or args.prompt_len < 1 or args.prompt_len + args.steps > cfg.max_seq_len:
            raise DSV4Error(f"--steps and --prompt-len must be >= 1 and fit max_seq_len={cfg.max_seq_len}")
        device = rank_device(env, args.device)
        args.decoder = args.decoder or ("full" if device.type == "cuda" else "eager")
        if args.decoder not in DECODERS:
            raise DSV4Error(f"unknown --decoder {args.decoder!r}; choose one of {', '.join(DECODERS)}")
        if args.verify and args.decoder == "reference":
            raise DSV4Error("--verify checks graph replay: use it with --decoder eager, ab or full")
        if args.decoder in ("ab", "full") and device.type != "cuda":
            raise DSV4Error(f"--decoder {args.decoder} captures CUDA graphs; use eager or reference on the CPU")
        init_distributed(env, device)
        res = tp_decode(args, env, device)
        shutdown_distributed()  # the check below is rank 0's alone
        ok = True
        if env.rank == 0:
            rows = check_unsharded(args, device, res) if args.check else []
            tol = args.tol if args.tol is not None else (1e-5 if args.dtype == "float32" else None)
            ok = report(args, res, rows, tol)
            res["check"] = rows
        if args.json is not None:
            args.json.mkdir(parents=True, exist_ok=True)
            clean = {k: v for k, v in res.items() if not k.startswith("_")}
            (args.json / f"rank{env.rank}.json").write_text(json.dumps(clean, indent=1) + "\n")
        return 0 if ok else 1
    except DSV4Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        import torch.distributed as dist

        if dist.is_initialized():  # an error on the way: no barrier, the peers may be gone
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
