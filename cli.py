"""dsv4-audit command line: each command parses options and hands off to dsv4/ or audit/.

Bad input never shows a traceback: user errors (DSV4Error, AuditError) print one line and exit 2.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Iterator

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help=__doc__.splitlines()[0].rstrip(".") + ". Exit codes: 0 clean, 1 findings, 2 bad input.")
TARGET_HELP = ("FILE.py:FACTORY, pkg.module:FACTORY (installed code), hf:DIR (a local transformers model folder "
               "or config.json; random weights when it has none) or dsv4:<preset> (default dsv4:tiny)")
CACHE_HELP = "hf:DIR targets: dynamic (DynamicCache, default) | static (StaticCache sized for the run)"
BATCH_HELP = "hf:DIR and dsv4 targets: decode batch size (default 1)"
PROMPT_HELP = "hf:DIR and dsv4 targets: prompt length prefilled before the decode steps (default 8)"
FAIL_ON_HELP = ("exit 1 when a finding at or above this severity exists: blocks-capture | silent-corruption | "
                "performance | never (default: never without --target, the embedded demo; silent-corruption "
                "with one: fail unless graph-ready)")
console = Console()
err_console = Console(stderr=True)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """One clear line and exit 2 for anything the user can fix."""
    from dsv4.errors import DSV4Error

    try:
        from audit.errors import AuditError
    except ImportError:  # audit not built yet
        AuditError = DSV4Error  # type: ignore[misc,assignment]
    try:
        yield
    except (DSV4Error, AuditError) as e:
        err_console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/]")
        raise typer.Exit(130) from None


@app.command("make-checkpoint")
def make_checkpoint_cmd(
    out: Path = typer.Option(..., "--out", help="output directory (written atomically)"),
    preset: str = typer.Option("tiny", "--preset", help="tiny | flash | pro | flash-h200"),
    seed: int = typer.Option(0, "--seed", help="seed of the random weights (same as dsv4.load(preset, seed=...))"),
    fmt: str = typer.Option("fp8", "--format", help="fp8 (released: FP8 dense + FP4 experts) | nvfp4 | bf16"),
    shards: int = typer.Option(2, "--shards", help="number of safetensors shards (1 = model.safetensors)"),
    force: bool = typer.Option(False, "--force", help="replace a non-empty output directory"),
) -> None:
    """Write a seeded synthetic checkpoint in exactly the released safetensors layout."""
    with user_errors():
        from dsv4.checkpoint_write import make_checkpoint

        path = make_checkpoint(preset, out, seed=seed, fmt=fmt, n_shards=shards, force=force)
        size = sum(f.stat().st_size for f in path.iterdir())
    console.print(f"wrote {path} ({preset}, seed {seed}, {fmt}, {size / 2**20:.1f} MiB)")


@app.command("generate")
def generate_cmd(
    preset: str = typer.Option(None, "--preset", help="tiny | flash | pro | flash-h200 (default tiny)"),
    checkpoint: Path = typer.Option(None, "--checkpoint", help="checkpoint directory in the released layout"),
    prompt_ids: str = typer.Option(None, "--prompt-ids", help="comma-separated token ids (default 1,2,3)"),
    prompt: str = typer.Option(None, "--prompt", help="prompt text, tokenized by the checkpoint's tokenizer.json"),
    max_new_tokens: int = typer.Option(16, "--max-new-tokens", help="tokens to generate"),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda | cuda:N"),
    dtype: str = typer.Option("bfloat16", "--dtype", help="bfloat16 (released numerics) | float32 (exact math)"),
    seed: int = typer.Option(0, "--seed", help="seed of a preset's random weights and of sampling"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy; > 0 samples"),
    max_seq_len: int = typer.Option(None, "--max-seq-len", help="cache length (default: the config's)"),
    decoder: str = typer.Option("reference", "--decoder",
                                help="reference | eager (static path) | ab | full (CUDA graphs)"),
    verify: bool = typer.Option(False, "--verify", help="first check graph replay bitwise against eager (64 steps)"),
    fuse: bool = typer.Option(False, "--fuse", help="compile the static decoder's layers with inductor first "
                              "(with DSV4_KERNELS=1 on CUDA: the fastest decode)"),
) -> None:
    """Generate tokens; prints the ids and prefill / decode tokens/s."""
    with user_errors():
        from dsv4.errors import DSV4Error
        from dsv4.generate import decoder_for, generate, load_model, load_tokenizer, parse_ids

        if prompt is not None and prompt_ids is not None:
            raise DSV4Error("give either --prompt or --prompt-ids, not both")
        tokenizer = load_tokenizer(checkpoint) if prompt is not None else None
        ids = tokenizer.encode(prompt).ids if tokenizer else parse_ids(prompt_ids or "1,2,3")
        model = load_model(preset, checkpoint, device=device, dtype=dtype, seed=seed, max_seq_len=max_seq_len)
        runner, graph_dec = decoder_for(model, decoder, fuse=fuse)
        if verify:
            _verify_replay(graph_dec, decoder)
        out = generate(runner, ids, max_new_tokens, temperature=temperature, seed=seed)
    new = out.tokens[0].tolist()
    console.print(f"prompt ids ({len(ids)}): {','.join(map(str, ids))}", soft_wrap=True, highlight=False)
    console.print(f"generated ids ({len(new)}): {','.join(map(str, new))}", soft_wrap=True, highlight=False)
    if tokenizer is not None:
        console.print(f"generated text: {tokenizer.decode(new)!r}", soft_wrap=True, highlight=False)
    decode = "n/a (1 token)" if out.decode_tok_s is None else (
        f"{out.decode_steps} steps in {out.decode_s:.3f} s = {out.decode_tok_s:.1f} tokens/s")
    console.print(f"prefill: {out.prompt.numel()} tokens in {out.prefill_s:.3f} s = {out.prefill_tok_s:.1f} tokens/s;"
                  f" decode: {decode}", soft_wrap=True, highlight=False)


def _verify_replay(graph_dec, decoder: str) -> None:
    """--verify: 64 steps on random prompts, graph logits and caches bitwise against the eager static path."""
    from dsv4.decode.verify import verify_replay
    from dsv4.errors import DSV4Error

    if graph_dec is None or decoder == "eager":
        raise DSV4Error("--verify checks graph replay: use it with --decoder ab or --decoder full")
    res = verify_replay(graph_dec, steps=64)
    if not res.ok:
        err_console.print(f"[bold red]replay mismatch:[/] {len(res.mismatched_steps)}/{res.steps} steps differ; "
                          f"{res.first_mismatch}")
        raise typer.Exit(1)
    console.print(f"verify: {res.steps} steps, graph ({decoder}) bitwise equal to eager", highlight=False)


@app.command("bisect")
def bisect_cmd(
    target: str = typer.Option(None, "--target", help=TARGET_HELP),
    path: str = typer.Option("reference", "--path", help="reference | static (dsv4 targets)"),
    layers: str = typer.Option(None, "--layers", help="layers to bisect, e.g. 0-3 or 0,2,5-6 (default all)"),
    device: str = typer.Option("cuda:0", "--device", help="cuda | cuda:N"),
    out: Path = typer.Option(None, "--out", help="output directory (default reports/bisect-<target>/)"),
    root: str = typer.Option(None, "--root", help="module whose children are the layers (default: found)"),
    mode: str = typer.Option("global", "--mode", help="capture_error_mode: global | thread_local | relaxed"),
    steps: int = typer.Option(3, "--steps", help="replay steps compared bitwise against eager"),
    warmup: int = typer.Option(2, "--warmup", help="warmup runs on the capture stream (>= 2)"),
    scan: Path = typer.Option(None, "--scan", help="inventory.json of a `scan` of the same target: leaf lines"),
    timeout: float = typer.Option(600.0, "--timeout", help="seconds one trial capture may take"),
    fail_on: str = typer.Option(None, "--fail-on", help=FAIL_ON_HELP),
    cache: str = typer.Option(None, "--cache", help=CACHE_HELP),
    batch: int = typer.Option(None, "--batch", help=BATCH_HELP),
    prompt_len: int = typer.Option(None, "--prompt-len", help=PROMPT_HELP),
) -> None:
    """Trial-capture the step, then each layer, down to the smallest module that fails (needs CUDA).

    Exit codes: 0 clean, 1 findings at or above --fail-on, 2 bad input (or no CUDA)."""
    with user_errors():
        from audit.capture.view import require_cuda, run_bisect
        from audit.report.gate import default_fail_on, fail_on_code

        fail_on = default_fail_on(fail_on, target is not None)
        require_cuda(device)
        _, inv = run_bisect(target or "dsv4:tiny", path=path, layers=layers, device=device, out=out, root=root, mode=mode, steps=steps,
                   warmup=warmup, scan=scan, timeout=timeout, console=console,
                   options=_target_options(cache, batch, prompt_len))
        code = fail_on_code(inv, fail_on, err_console)
    raise typer.Exit(code)


@app.command("scan")
def scan_cmd(
    target: str = typer.Option(None, "--target", help=TARGET_HELP),
    path: str = typer.Option("reference", "--path", help="dsv4 targets: reference | static decode path"),
    device: str = typer.Option(None, "--device", help="cpu | cuda | cuda:N (default: cuda if available)"),
    steps: int = typer.Option(4, "--steps", help="audited steady-state steps (>= 2)"),
    warmup: int = typer.Option(2, "--warmup", help="plain steps run before auditing"),
    out: Path = typer.Option(None, "--out", help="output directory (default reports/scan-<target>-<path>/)"),
    tp: int = typer.Option(None, "--tp", help="under torchrun: shard a dsv4 target over this many ranks "
                           "(default WORLD_SIZE); each rank writes OUT/rank<r>/, rank 0 the merge"),
    fail_on: str = typer.Option(None, "--fail-on", help=FAIL_ON_HELP),
    cache: str = typer.Option(None, "--cache", help=CACHE_HELP),
    batch: int = typer.Option(None, "--batch", help=BATCH_HELP),
    prompt_len: int = typer.Option(None, "--prompt-len", help=PROMPT_HELP),
) -> None:
    """Audit a decode step for CUDA-graph hazards; writes inventory.md/.json/.csv/.sarif.

    Exit codes: 0 clean, 1 findings at or above --fail-on (or the target raised: the partial inventory is written), 2 bad input."""
    with user_errors():
        from audit.report.gate import default_fail_on

        fail_on = default_fail_on(fail_on, target is not None)
        if _under_torchrun(tp):  # each rank scans, rank 0 merges: wraps the plain scan from outside
            from audit import ranks

            code = ranks.scan_command(target, path, device, steps, warmup, out, console, err_console, tp=tp,
                                      fail_on=fail_on)
        else:
            from audit.scan.command import scan_command

            code = scan_command(target, path, device, steps, warmup, out, console, err_console, fail_on,
                                options=_target_options(cache, batch, prompt_len))
    raise typer.Exit(code)


def _target_options(cache: str | None, batch: int | None, prompt_len: int | None) -> dict:
    """--cache / --batch / --prompt-len for hf: (and dsv4:) targets; checked where the target is built."""
    return {k: v for k, v in (("cache", cache), ("batch", batch), ("prompt_len", prompt_len)) if v is not None}


def _under_torchrun(tp: int | None) -> bool:
    return (tp is not None and tp > 1) or int(os.environ.get("WORLD_SIZE") or 1) > 1


@app.command("report")
def report_cmd(
    inventory: Path = typer.Argument(..., help="inventory.json of a scan"),
    baseline: Path = typer.Option(None, "--baseline", help="an older inventory.json: show fixed / new / remaining"),
    out: Path = typer.Option(None, "--out", help="write the markdown to this file instead of stdout"),
    fail_on_new: bool = typer.Option(False, "--fail-on-new", help="with --baseline: exit 1 when a finding (performance "
                                     "or worse) is not in the baseline; matched by category and site, robust to "
                                     "line shifts"),
) -> None:
    """Render an inventory (or its diff against a baseline) as markdown.

    Exit codes: 0 clean (or no new findings under --fail-on-new), 1 new findings, 2 bad input
    (unreadable inventory, unknown schema major version)."""
    with user_errors():
        from audit.errors import AuditError
        from audit.report import gate, writers
        from audit.report.terminal import report_command

        if fail_on_new and baseline is None:
            raise AuditError("--fail-on-new compares against a baseline: pass --baseline OLD/inventory.json")
        report_command(inventory, baseline, out, console)
        code = gate.new_code(writers.load(inventory), writers.load(baseline), err_console) if fail_on_new else 0
    raise typer.Exit(code)


@app.command("bench")
def bench_cmd(
    preset: str = typer.Option("flash-h200", "--preset", help="tiny | flash | pro | flash-h200"),
    modes: str = typer.Option("eager,ab,full,compile", "--modes", help="comma list of eager, ab, full, compile"),
    steps: int = typer.Option(64, "--steps", help="timed decode steps per row"),
    batch: str = typer.Option("1", "--batch", help="comma list of batch sizes, e.g. 1,4,16"),
    context: str = typer.Option("", "--context", help="comma list of context lengths, e.g. 1024,16384 "
                                "(default 1024, or the longest the preset holds)"),
    layers: int = typer.Option(None, "--layers", help="first N layers only (default: all)"),
    device: str = typer.Option(None, "--device", help="cuda | cpu (default: cuda if available)"),
    dtype: str = typer.Option("bfloat16", "--dtype", help="bfloat16 | float32"),
    verify_steps: int = typer.Option(8, "--verify-steps", help="bitwise graph-vs-eager steps before timing"),
    out: Path = typer.Option(Path("reports"), "--out", help="directory for bench-<preset>.md/.json/.png"),
    kernels: bool = typer.Option(True, "--kernels/--no-kernels", help="weight-only decode kernels (CUDA)"),
    fuse: bool = typer.Option(True, "--fuse/--no-fuse", help="inductor-fused layers inside the ab/full graphs"),
    append: bool = typer.Option(False, "--append", help="merge into the saved bench-<preset>.json in --out "
                                "(rows measured again replace the old ones)"),
) -> None:
    """Decode latency: eager vs A/B graph vs full graph vs torch.compile, against the bandwidth floor."""
    with user_errors():
        import torch
        from rich.progress import Progress

        from audit.bench.run import bench
        from audit.bench.report import json_path, read_json, rich_table, write_json, write_reports
        from audit.errors import AuditError

        try:
            mode_list = [m.strip() for m in modes.split(",") if m.strip()]
            batches = [int(b) for b in batch.split(",")]
            contexts = [int(c) for c in context.split(",")] if context.strip() else None
        except ValueError:
            raise AuditError("--batch and --context take comma-separated integers") from None
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device == "cpu" and any(m != "eager" for m in mode_list):
            console.print("[yellow]no CUDA: graph modes (ab, full, compile) need CUDA; running eager only[/]")
        with Progress(console=console, transient=True) as bar:
            rows = len(batches) * len(contexts or [0])  # a full row on CUDA is profiled again after all timing
            task = bar.add_task("decode bench", total=rows * (len(mode_list) + (device != "cpu" and "full" in mode_list)))
            earlier = read_json(json_path(out, preset)) if append else None

            def save(partial):  # after every row: a run cut short keeps what it measured
                write_json(earlier.merged(partial) if earlier else partial, out)

            res = bench(preset, mode_list, steps, batches, contexts, device, layers, dtype, verify_steps,
                        progress=lambda: bar.advance(task), kernels=kernels and device != "cpu", fuse=fuse,
                        on_row=save)
        if earlier:
            res = earlier.merged(res)
        console.print(rich_table(res))
        files = write_reports(res, out)
    console.print("wrote " + ", ".join(str(f) for f in files))


def main() -> None:  # pragma: no cover - console entry for `python cli.py`
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
