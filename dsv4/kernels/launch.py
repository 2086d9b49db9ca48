"""Host side of the CuTe kernels: checks, tensor views, the compile cache, graph-safe launches.

Graph safety (docs/kernels.md):
- compile once per (kernel, shapes, strides, dtypes, device, tile choice) and cache the compiled
  function, never a stream; a first use inside CUDA-graph capture raises instead of compiling;
- every call passes `cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)`, so inside
  capture the launch lands on the capturing stream and becomes a graph node;
- conversions (`from_dlpack`) and the launch run with the tensors' device current;
- outputs are torch allocations (static under capture: the graph's private pool) or the
  caller's buffer; expert ids stay on the device (read by the kernel, never by the host).
"""

from __future__ import annotations

import os
import warnings

import torch

from dsv4.errors import DSV4Error
from dsv4.kernels import MAX_DENSE_ROWS

__all__ = ["fp4_grouped_gemv", "nvfp4_grouped_gemv", "fp8_gemv", "try_expert", "try_dense", "probe",
           "CompileError", "WARPS", "MAX_DENSE_ROWS", "TUNE"]

WARPS = 4            # warps per CTA (128 threads)
# bench overrides (None: the launchers' own choice): rows per warp (nw), prefetch depth of the grouped e2m1
# kernel (pd) and of the FP8 GEMV (pd8), row blocks a CTA streams through one pipeline (rb, rb8), warps per
# CTA (warps), and the most shared memory (bytes) a CTA may take to round its x rows once (quant=True, kernel
# Q = 2); x rows larger than that (or wo_a's groups) are rounded by every warp in registers (Q = 1); the
# tensor-core FP4 kernel on/off at batch 1 (mma, else DSV4_CUTE_MMA) and for the grouped slots (mma_slots, else
# DSV4_CUTE_MMA_SLOTS), its warps (one 16-row tile each) and prefetch depth in 128-K steps
TUNE: dict[str, int | None] = {"nw": None, "pd": 2, "pd8": None, "round_smem": 32768, "rb": 1, "rb8": None,
                               "warps": None, "mma": None, "mma_slots": None, "mma_warps": None, "mma_pd": None}
_CACHE: dict[tuple, object] = {}
_SMS: dict[int, int] = {}
_AVAILABLE: list[bool] = []


def _available() -> bool:
    if not _AVAILABLE:
        from dsv4.kernels import available

        _AVAILABLE.append(available())
    return _AVAILABLE[0]


def _sms(device: torch.device) -> int:
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _SMS:
        _SMS[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _SMS[i]


def _warps() -> int:
    return int(TUNE["warps"] or WARPS)


def fp8_shape(M: int, groups: int, steps: int) -> tuple[int, int, int]:
    """(warps per CTA, prefetch depth in steps, row blocks per CTA) of an FP8 launch, where TUNE leaves them
    None. steps = K / 512 (one 16-byte chunk per lane a step). The batch-1 rule is the H200's kernel bench
    over launch shapes (`python -m dsv4.kernels.bench --shapes`, dsv4/kernels/NOTES.md "Session 17"): rows of
    at most 4 steps (wq_b, the shared w2) run two row blocks per CTA through one pipeline (71 -> 78% and 49 ->
    57% of copy bandwidth); rows of 8 steps or more (wq_a|wkv, the shared w1|w3, wo_b) take 8-warp CTAs with
    every step in flight (41 -> 51%, 59 -> 60%, 62 -> 67%); wo_a's groups and larger batches keep 4 warps,
    depth 4, one block. In the decode step, where a norm or pointwise kernel precedes each GEMV under PDL,
    the rule measured neutral (the FP8 family's time unchanged)."""
    warps, pd, rb = WARPS, 4, 1
    if M == 1 and groups == 1:
        if steps <= 4:
            pd, rb = steps, 2
        elif steps >= 8:
            warps, pd = 8, 8
    return (int(TUNE["warps"] or warps), min(int(TUNE["pd8"] or pd), steps),
            int(TUNE["rb8"] or rb))


def pick_nw(groups: int, n: int, sms: int, cap: int = 4, warps: int | None = None) -> int:
    """Output rows per warp: the most (x reuse) that still gives >= 4 CTAs per SM, else 1."""
    if TUNE["nw"]:
        return min(int(TUNE["nw"]), cap)
    for nw in (4, 2):
        if nw <= cap and groups * -(-n // ((warps or _warps()) * nw)) >= 4 * sms:
            return nw
    return 1


def _pdl(x: torch.Tensor) -> bool:
    """Programmatic dependent launch for this launch (a compile-time flag of the kernels)."""
    try:
        from dsv4.kernels import _pdl  # reads Triton's PDL support
    except ImportError:  # CuTe without Triton: plain launches
        return False
    return _pdl.applies(x)


def _sig(t: torch.Tensor) -> tuple:
    return tuple(t.shape), tuple(t.stride()), str(t.dtype)


def _aligned(*ts: torch.Tensor) -> bool:
    return all(t.data_ptr() % 16 == 0 and t.stride(-1) == 1 for t in ts)


def _stream(device: torch.device):
    import cuda.bindings.driver as cuda

    return cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)


class CompileError(DSV4Error):
    """The CuTe compiler rejected a shape; the integration points fall back to the twin."""


def _run(key: tuple, entry: str, tensors: list, align: list[int], consts: tuple, device):
    """Compile (once, outside capture) and launch `entry` on the current stream of `device`."""
    from cutlass.cute.runtime import from_dlpack

    with torch.cuda.device(device):
        args = [from_dlpack(t, assumed_align=a) for t, a in zip(tensors, align)]
        stream = _stream(device)
        if key not in _CACHE:
            if torch.cuda.is_current_stream_capturing():
                raise DSV4Error(f"CuTe kernel {entry} first called inside CUDA-graph capture; run the "
                                "step once eagerly first (compilation is not capturable)")
            import cutlass.cute as cute

            from dsv4.kernels import _cute_gemv, _cute_mma

            try:
                module = _cute_mma if entry in _cute_mma.__dict__ else _cute_gemv
                _CACHE[key] = cute.compile(getattr(module, entry), *args, stream, *consts)
            except Exception as e:  # noqa: BLE001 - remembered: never retried, reported once
                _CACHE[key] = None
                warnings.warn(f"CuTe kernel {entry} does not compile for {key[1:]}: {e}", stacklevel=3)
                raise CompileError(f"{entry}: {e}") from e
        fn = _CACHE[key]
        if fn is None:
            raise CompileError(f"{entry} did not compile for this shape earlier")
        fn(*args, stream)


def _check_rows(x: torch.Tensor, k: int) -> None:
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != k or not x.is_contiguous():
        raise DSV4Error(f"x must be contiguous bf16 [rows, {k}], got {x.dtype} {tuple(x.shape)}")


def _out(out, rows: int, n: int, device) -> torch.Tensor:
    if out is None:
        return torch.empty(rows, n, dtype=torch.float32, device=device)
    if out.shape != (rows, n) or out.dtype != torch.float32 or not out.is_contiguous():
        raise DSV4Error(f"out must be contiguous fp32 [{rows}, {n}]")
    return out


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def _check_quant(quant: bool, K: int, name: str) -> None:
    if quant and K % 128:
        raise DSV4Error(f"{name}: the in-kernel activation rounding needs K a multiple of 128, got {K}")


def _round_mode(quant: bool, x_bytes: int, groups: int = 1) -> int:
    """The kernels' Q: 0 no rounding, 1 every warp rounds in registers, 2 the CTA rounds once into shared
    memory (x_bytes: the x rows one CTA reads). DSV4_CUTE_ROUND=registers keeps 1 everywhere (an A/B)."""
    if not quant:
        return 0
    if os.environ.get("DSV4_CUTE_ROUND", "").strip().lower() == "registers":
        return 1
    return 2 if groups == 1 and x_bytes <= int(TUNE["round_smem"] or 0) else 1


def _grouped(fmt: str, x, weight, scale, global_scale, idx, out, quant: bool = False) -> torch.Tensor:
    """One launcher for both expert formats: the same CuTe kernel, NV a compile-time flag."""
    E, N, Kh = weight.shape
    K = 2 * Kh
    _check_rows(x, K)
    R = idx.shape[0] if idx.dim() == 1 else -1
    nv = fmt == "nvfp4"
    if K % 32 or scale.shape != (E, N, K // (16 if nv else 32)) or x.shape[0] not in (R, 1):
        raise DSV4Error(f"{fmt}_grouped_gemv: inconsistent shapes")
    _check_quant(quant, K, f"{fmt}_grouped_gemv")
    y = _out(out, R, N, x.device)
    if R == 0:
        return y
    xw, ww = x.view(torch.int32), weight.view(torch.int32)
    sw = scale.view(torch.int16) if nv else _u8(scale)  # one 16-byte chunk: 2 e4m3 or 1 e8m0 scales
    g = global_scale.reshape(E).float().contiguous() if nv else sw  # mG is not read for FP4
    if not _aligned(xw, ww):
        raise DSV4Error(f"{fmt}_grouped_gemv: x and weight need 16-byte aligned rows")
    KC = K // 32
    if _uses_mma(fmt, KC):
        return _mma_run(xw, ww, sw, idx, idx, None, y, N, KC, x, x.shape[0] == 1, 2 if quant else 0, R)
    nw = pick_nw(R, N, _sms(x.device))
    consts = (N, KC, nw, _warps(), -(-KC // 32), R, int(TUNE["pd"]), nv, _pdl(x), x.shape[0] == 1,
              _round_mode(quant, 2 * K), int(TUNE["rb"]))  # the rounding mode Q, then row blocks, as fp8_dense's
    key = ("fp4_grouped", _sig(xw), _sig(ww), _sig(sw), _sig(g), _sig(idx), x.device, consts)
    _run(key, "fp4_grouped", [xw, ww, sw, g, idx, y], [16, 16, 2 if nv else 1, 4 if nv else 1,
                                                   idx.element_size(), 4], consts, x.device)
    return y


def _mma_on(key: str, env: str) -> bool:
    on = TUNE[key] if TUNE[key] is not None else os.environ.get(env, "0").strip() == "1"
    return bool(on)


def _uses_mma(fmt: str, blocks: int) -> bool:
    """The tensor-core FP4 kernel (_cute_mma.py) takes batch-1 expert rows when K is whole 128-steps:
    DSV4_CUTE_MMA=1 (or TUNE["mma"]) turns it on."""
    return _mma_on("mma", "DSV4_CUTE_MMA") and fmt == "fp4" and blocks % 4 == 0


def slots_mma(fmt: str, K: int, rows: int, experts: int) -> bool:
    """Whether the grouped Triton launch hands its slots to the tensor-core kernel (fp4_slots) instead of its
    own GEMM: FP4, K whole 128-steps, the CuTe DSL importable, and at most 4 rows per expert on average (each
    8 rows of a slot re-read its expert's weights; on the H200 at 32 experts, 96 rows: 130 against 148 us
    for w1 | w3, 384 rows: 262 against 186). DSV4_CUTE_MMA_SLOTS=0 / 1 (or TUNE["mma_slots"]) forces it."""
    forced = TUNE["mma_slots"] if TUNE["mma_slots"] is not None else os.environ.get("DSV4_CUTE_MMA_SLOTS", "").strip()
    if forced in (0, "0"):
        return False
    fits = fmt == "fp4" and K % 128 == 0 and _available()
    return fits and (forced in (1, "1") or rows <= 4 * experts)


def _mma_run(xw, ww, sw, idx, rows, slots, y, N: int, KB: int, x, one: bool, q: int, grid_rows: int):
    warps = int(TUNE["mma_warps"] or WARPS)
    pd = TUNE["mma_pd"] or (4 if slots is not None else 8)  # H200 kernel bench: batch 1 w1|w3 50 -> 62% at 8
    consts = (N, KB, warps, int(pd), _pdl(x), one, q, slots is not None, grid_rows)
    slots = idx.view(1, -1) if slots is None else slots  # not read without SLOTS
    key = ("fp4_mma", _sig(xw), _sig(ww), _sig(sw), _sig(idx), _sig(rows), _sig(slots), x.device, consts)
    _run(key, "fp4_mma", [xw, ww, sw, idx, rows, slots, y], [16, 16, 1, idx.element_size(), 4, 4, 4], consts,
         x.device)
    return y


def fp4_slots(x, weight, scale, rows, slots, out) -> torch.Tensor:
    """The grouped FP4 experts on tensor cores from the Triton grouping launch's slots: x [R, K] bf16 (rounded
    there when asked), rows [R] int32 (row ids sorted by expert), slots [3, P] int32 (expert, first sorted
    position, row count of the p-th present expert), out [R, N] fp32."""
    E, N, Kh = weight.shape
    xw, ww = x.view(torch.int32), weight.view(torch.int32)
    if not _aligned(xw, ww) or x.shape[1] != 2 * Kh:
        raise DSV4Error("fp4_slots: x and weight need 16-byte aligned rows of K / 2 bytes")
    return _mma_run(xw, ww, _u8(scale), rows, rows, slots, out, N, 2 * Kh // 32, x, False, 0, slots.shape[1])


def fp4_grouped_gemv(x, weight, scale, idx, out=None, quant: bool = False) -> torch.Tensor:
    """x [R, K] bf16 (or [1, K]: every row reads it), weight [E, N, K/2] int8 (e2m1 pairs), scale
    [E, N, K/32] e8m0, idx [R] -> fp32 [R, N].
    quant: x is unrounded; the kernel rounds it as fp8_fake_quant(x, 128) first (K % 128 == 0)."""
    return _grouped("fp4", x, weight, scale, None, idx, out, quant)


def nvfp4_grouped_gemv(x, weight, scale, global_scale, idx, out=None) -> torch.Tensor:
    """As fp4_grouped_gemv with scale [E, N, K/16] e4m3 and global_scale [E] fp32."""
    return _grouped("nvfp4", x, weight, scale, global_scale, idx, out)


def fp8_gemv(x, weight, scale, out=None, groups: int = 1, quant: bool = False) -> torch.Tensor:
    """x [M, K] bf16, weight [N, K] e4m3, scale [ceil(N/128), ceil(K/128)] e8m0 -> fp32 [M, N].

    groups G > 1 (wo_a): x is [M * G, K] and output rows [g*N/G, (g+1)*N/G) read x row m*G + g.
    quant: x is unrounded; the kernel rounds it as fp8_fake_quant(x, 128) first (K % 128 == 0)."""
    N, K = weight.shape
    _check_rows(x, K)
    M = x.shape[0] // groups
    if K % 16 or scale.shape != (-(-N // 128), -(-K // 128)):
        raise DSV4Error("fp8_gemv: K must be a multiple of 16 and scale [ceil(N/128), ceil(K/128)]")
    if x.shape[0] != M * groups or N % groups or (groups > 1 and (N // groups) % 4):
        raise DSV4Error(f"fp8_gemv: {groups} groups need x rows a multiple of groups and N/groups % 4 == 0")
    _check_quant(quant, K, "fp8_gemv")
    y = _out(out, M, N, x.device)
    if M == 0:
        return y
    xw, ww, sw = x.view(torch.int32), weight.view(torch.int32), _u8(scale)
    if not _aligned(xw, ww):
        raise DSV4Error("fp8_gemv: x and weight need 16-byte aligned rows")
    KC = K // 16
    mb = min(M, 8)
    warps, pd, rb = fp8_shape(M, groups, -(-KC // 32))
    nw = pick_nw(-(-M // mb), N, _sms(x.device), cap=4 if M == 1 else 2, warps=warps)
    consts = (M, N, KC, nw, warps, -(-KC // 32), mb, pd, groups, _pdl(x), _round_mode(quant, 2 * K * mb, groups), rb)
    key = ("fp8_dense", _sig(xw), _sig(ww), _sig(sw), x.device, consts)
    _run(key, "fp8_dense", [xw, ww, sw, y], [16, 16, 1, 4], consts, x.device)
    return y


# ------------------------------------------------------------------ integration (None = use the twin)


def try_expert(fmt: str, x: torch.Tensor, bank: dict, idx: torch.Tensor, quant: bool = False) -> torch.Tensor | None:
    w = bank["weight"]
    if x.dtype != torch.bfloat16 or x.dim() != 2 or w.shape[-1] * 2 != x.shape[1] or x.shape[1] % (128 if quant else 32):
        return None
    if not _available() or idx.dtype not in (torch.int32, torch.int64):
        return None
    if x.shape[0] > 1 and x.stride(0) == 0:  # one token's row expanded to its k experts: read it once
        x = x.as_strided((1, x.shape[1]), (x.shape[1], x.stride(1)))
    x, idx = x.contiguous(), idx.contiguous()
    if not _aligned(x, w) or (w.stride(1) * w.element_size()) % 16 or (w.stride(0) * w.element_size()) % 16:
        return None
    try:
        if fmt == "fp4":
            return fp4_grouped_gemv(x, w, bank["scale"], idx, quant=quant)
        return _grouped("nvfp4", x, w, bank["scale"], bank["global_scale"], idx, None, quant)
    except CompileError:
        return None


def try_dense(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, groups: int = 1,
              quant: bool = False) -> torch.Tensor | None:
    """x [M * groups, K] -> fp32 [M, N], or None (the caller runs the twin)."""
    N, K = weight.shape
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[-1] != K or K % (128 if quant else 16) \
            or weight.dtype != torch.float8_e4m3fn:
        return None
    x2 = x.contiguous()
    if not 0 < x2.shape[0] <= MAX_DENSE_ROWS * groups or x2.shape[0] % groups or not _available():
        return None
    if N % groups or (groups > 1 and (N // groups) % 4) or not weight.is_contiguous() or not _aligned(x2, weight):
        return None
    try:
        return fp8_gemv(x2, weight, scale, groups=groups, quant=quant)
    except CompileError:
        return None


def probe(words: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Run the PTX decode helpers on int32 words [T <= 1024] (GPU tests pin the element order)."""
    T = words.numel()
    dev = words.device
    outs = [torch.full((T, k), float("nan"), device=dev) for k in (8, 4, 2, 2)]
    key = ("probe", T, dev)
    _run(key, "probe", [words.contiguous()] + outs, [4, 4, 4, 4, 4], (T,), dev)
    return tuple(outs)
