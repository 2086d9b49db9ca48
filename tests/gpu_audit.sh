#!/usr/bin/env bash
# The auditor's GPU slice, in two device calls (each step has its own time limit; under 9 min per part):
#   PART=tests    the audit's GPU tests, which measure precision over the planted suite once (CPU scan vs CUDA
#                 scan, table and TOTAL in the log, rows in $OUT/precision.json), sync attribution, streams;
#   PART=reports  the H200 reports regenerated: CUDA scans of the tiny model, the static and reference bisections.
# (The capture tests are their own slice: `pytest -m gpu tests/test_capture_gpu.py`.) Everything lands in $OUT
# (two tarballs + the tables); the summary is last.
#   PART=tests OUT=/tmp/gpu_audit bash tests/gpu_audit.sh; PART=reports OUT=/tmp/gpu_audit bash tests/gpu_audit.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-/tmp/gpu_audit}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LOGS=/tmp/gpu_audit_logs
mkdir -p "$OUT" $LOGS/logs
sum="$OUT/summary.txt"; : > "$sum"
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout "$limit" "$@" > "$LOGS/logs/$name.log" 2>&1; local rc=$?
  printf '%-18s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" \
    "$(grep -E '[0-9]+ (passed|failed)|^TOTAL|graph-ready|leaves|error:' "$LOGS/logs/$name.log" | tail -1)" | tee -a "$sum"; }
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())" >> "$sum" 2>&1
PART="${PART:-tests}"
R=reports/h200
if [ "$PART" = tests ]; then
  step gpu-audit-tests 420 env GPU_PRECISION_JSON="$OUT/precision.json" \
    python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_gpu_precision.py tests/test_cross_device.py
else
  step scan-ref-cuda 60 python3 -m cli scan --device cuda --fail-on never --out $R/scan-tiny-reference-cuda
  step scan-static-cuda 60 python3 -m cli scan --device cuda --path static --out $R/scan-tiny-static-cuda
  tar czf "$OUT/reports.tgz" $R  # again at the end; a call cut short still brings the scans back
  step bisect-static 90 python3 -m cli bisect --target dsv4:tiny --path static --out $R/bisect-dsv4-tiny-static
  step bisect-ref 240 python3 -m cli bisect --target dsv4:tiny --layers 0-1 --fail-on never \
    --scan $R/scan-tiny-reference-cuda/inventory.json --out $R/bisect-dsv4-tiny-reference
  tar czf "$OUT/reports.tgz" $R
fi
tar czf "$OUT/logs.tgz" -C $LOGS logs
grep -hE "^TOTAL|cuda off-plant" $LOGS/logs/gpu-audit-tests.log >> "$sum" 2>/dev/null
grep -hE "^(FAILED|ERROR)" $LOGS/logs/gpu-*-tests.log 2>/dev/null | head -12 >> "$sum"
cat "$sum"
