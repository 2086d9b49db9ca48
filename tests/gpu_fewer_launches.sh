#!/usr/bin/env bash
# GPU checks of issue 15 (fewer launches per layer) in one device call, CuTe DSL importable:
# kernel tests (merged FP4/NVFP4 kernel, wo_a groups in one FP8 launch, graphs, tiny decoder),
# fused-graph tests (bitwise replay, float32 196 steps vs the reference path), the mixes, attention,
# compressor entry / whole-step and comb kernels, the attention entry, index query and gate kernels (one launch,
# float64 / twin, graph replay), kernel bench.
# Logs go to $OUT; a short summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-/tmp/dsv4_fewer_out}" PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-}:$PWD"
mkdir -p "$OUT"
python3 -c "import cutlass.cute" || exit 3
timeout 200 python3 -m pytest -q -s -p no:cacheprovider tests/test_kernels_gpu.py \
  -k "decode_helpers or (flash and w1) or grouped_wo_a or graphs or capture_raises or tiny_decoder" \
  > "$OUT/kernels_gpu.log" 2>&1; echo "kernels gpu rc=$?"
timeout 200 python3 -m pytest -q -s -p no:cacheprovider tests/test_fuse_gpu.py \
  -k "full or gemv or sinkhorn or mix_sums or sparse_attention or compress_entry" > "$OUT/fuse_gpu.log" 2>&1
echo "fuse gpu rc=$?"
timeout 120 python3 -m pytest -q -s -p no:cacheprovider tests/test_token_gpu.py tests/test_comb_gpu.py tests/test_qkv_gate_gpu.py \
  > "$OUT/compressor_gpu.log" 2>&1; echo "compressor/comb/entry/gate gpu rc=$?"
timeout 120 python3 -m dsv4.kernels.bench --quick > "$OUT/kbench.log" 2>&1; echo "kbench rc=$?"
grep -E "relerr" "$OUT/kernels_gpu.log" | cut -c1-120 | tail -12
grep -E "passed|failed|FAILED|Error" "$OUT"/*_gpu.log | cut -c1-240 | tail -12
grep -v '^{' "$OUT/kbench.log" | grep -E "cute|copy" | cut -c1-150
