#!/usr/bin/env bash
# GPU bench rows for issue 8, one slice per device call (each must finish inside the 10-minute limit:
# a fused flash-h200 build costs ~90 s per batch x context). Rows merge into the committed report:
#   tests/gpu_bench.sh --modes eager,full --batch 4 --context 1024
# copies reports/bench-flash-h200.json to $OUT/reports, runs `bench --append --out $OUT/reports`
# (the JSON is rewritten after every row, so a call cut short keeps its finished rows), and prints
# the table. Fetch $OUT/reports/* back over reports/ afterwards. Needs the CuTe DSL importable
# (see tests/gpu_kernels.sh) for the FP8/FP4 kernels; without it those run their twins.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-/tmp/dsv4_bench_out}" PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-}:$PWD"
mkdir -p "$OUT/reports"
cp reports/bench-flash-h200.json "$OUT/reports/" 2>/dev/null || true
timeout "${BENCH_TIMEOUT:-560}" python3 -m cli bench --preset flash-h200 --steps "${STEPS:-16}" --append \
  --out "$OUT/reports" "$@" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
grep -E "│|┃|error|wrote" "$OUT/bench.log" | tail -20
