#!/usr/bin/env bash
# One GPU call for the expert / FP8 GEMM tiles: the expert GEMM GPU tests and timing table, the same table
# once per TUNES override (DSV4_TRITON_TUNE, kind TUNE_KIND, test file TUNE_TEST), then the batch-16 bench row
# into $OUT/reports when B16_LIMIT is set. Summary printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-/tmp/gpu_x}" PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
sum="$OUT/summary.txt"; : > "$sum"
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  printf '%-12s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" \
    "$(grep -E '[0-9]+ (passed|failed)' "$OUT/$name.log" | tail -1 | cut -c1-120)" | tee -a "$sum"; return $rc; }
step experts ${TESTS_LIMIT:-150} python3 -m pytest -q -s -rA -p no:cacheprovider -m gpu tests/test_experts_gemm_gpu.py
i=0; for t in ${TUNES:-}; do i=$((i+1))
  step tune$i 90 env DSV4_TRITON_TUNE="{\"${TUNE_KIND:-experts}\": $t}" python3 -m pytest -q -s -p no:cacheprovider -m gpu \
    ${TUNE_TEST:-tests/test_experts_gemm_gpu.py} -k timing; echo "tune$i = $t" >> "$sum"; done
R="$OUT/reports"; mkdir -p "$R"
[ -n "${B16_LIMIT:-}" ] && step b16 $B16_LIMIT python3 -m cli bench --preset flash-h200 --steps 16 --out "$R" \
  --modes full --batch 16 --context 1024
for f in "$OUT"/experts.log "$OUT"/tune*.log; do [ -f "$f" ] && { echo "== $(basename $f)"; grep -E "us/call" "$f" | grep -E "${TUNE_GREP:-.}" | cut -c1-150; }; done >> "$OUT/ktimes.txt"
grep -hE "^(FAILED|ERROR)|Error|error:" "$OUT"/experts.log | cut -c1-200 | head -10 >> "$sum"
python3 - "$R" >> "$sum" 2>&1 <<'PY'
import glob, json, sys
from audit.bench.profile import families
for f in glob.glob(sys.argv[1] + "/bench-*.json"):
    for r in json.load(open(f))["rows"]:
        k = r.get("kernels") or []
        print(r["mode"], r["batch"], r["context"], round(r["ms_median"], 2), "ms", "kernels", k[0]["per_step"] if k else "-",
              r.get("bitwise_ok"), r.get("note", ""))
        for n, v in (families(k).items() if k else []):
            print(f"   {n:40s} {v['us_per_step']:9.0f} us {v['per_step']:6.0f}")
PY
cat "$OUT/ktimes.txt"; cat "$sum"
