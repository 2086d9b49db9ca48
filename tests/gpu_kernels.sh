#!/usr/bin/env bash
# GPU check of dsv4/kernels (issue 7): decode helpers, kernels vs twins at Flash/Pro shapes, graph
# capture, decoder integration; then the bandwidth benchmark. Installs nothing: nvidia-cutlass-dsl
# 4.8.1 (+ -libs-cu13) must be importable, e.g.
#   export PYTHONPATH=/opt/site:/opt/site/nvidia_cutlass_dsl/dsl_packages:$PWD
# QUICK=1: headline subset (~2 min: Flash shapes, graphs, tiny decoder, bench --quick);
# default: everything in tests/test_kernels_gpu.py. The tensor-core FP4 kernel and the launch-shape variants are
# their own slice (README: tests/test_cute_mma_gpu.py, test_cute_mma_slots_gpu.py, test_cute_blocks_gpu.py,
# 215 s on the H200). Full logs and the benchmark JSON go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-/tmp/dsv4_kernels_out}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader || true
python3 -c "import cutlass.cute, torch; print('cutlass ok, torch', torch.__version__)" || exit 3
SEL=(); BENCH=()
if [ "${QUICK:-0}" = "1" ]; then
  SEL=(-k "decode_helpers or (flash and w1) or graphs or capture_raises or tiny_decoder"); BENCH=(--quick)
fi
timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q -s -p no:cacheprovider tests/test_kernels_gpu.py "${SEL[@]}" \
  > "$OUT/pytest_gpu.log" 2>&1
echo "gpu tests rc=$?"
grep -E "relerr|e2m1 (got|want)|passed|failed|FAILED|ERROR|Error" "$OUT/pytest_gpu.log" | cut -c1-300 | tail -50
timeout "${BENCH_TIMEOUT:-240}" python3 -m dsv4.kernels.bench "${BENCH[@]}" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
grep -v '^{' "$OUT/bench.log" | tail -70
