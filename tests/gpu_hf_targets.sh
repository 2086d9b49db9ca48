#!/usr/bin/env bash
# GPU check for issue 14 points 1-2 (about 2 min): the hf:/library tests under the installed
# transformers, hf: and library targets scanned on CUDA, bisect on an hf: target. Logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-/tmp/gpu_hf_out}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())" 2>&1 | tail -1
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_audit_hf.py tests/test_audit_library.py > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|^FAILED|^E " "$OUT/pytest.log" | head -20
for c in dynamic static; do
  timeout 120 python3 -m cli scan --target hf:docs/examples/tiny-llama --cache $c --device cuda --fail-on never \
    --out "$OUT/scan-$c" > "$OUT/scan-$c.log" 2>&1; echo "scan $c rc=$?"; tail -3 "$OUT/scan-$c.log" | head -2
done
PYTHONPATH=$PWD/tests/planted_site timeout 90 python3 -m cli scan --target tests/planted/library_frames.py:make \
  --device cuda --fail-on never --out "$OUT/scan-lib" > "$OUT/scan-lib.log" 2>&1; echo "scan lib rc=$?"
python3 - <<'P'
import json, os
for n in ("scan-dynamic", "scan-static", "scan-lib"):
    p = os.path.join(os.environ["OUT"], n, "inventory.json")
    if not os.path.exists(p):
        print(n, "no inventory"); continue
    for f in json.load(open(p))["findings"]:
        if f["severity"] != "info":
            print(n, f["category"], f"{f['file']}:{f['line']}", f["op"], "<-", f"{f['caller_file']}:{f['caller_line']}")
P
timeout 240 python3 -m cli bisect --target hf:docs/examples/tiny-llama --cache static --layers 0-1 --device cuda:0 \
  --fail-on never --out "$OUT/bisect-static" > "$OUT/bisect.log" 2>&1; echo "bisect rc=$?"; tail -8 "$OUT/bisect.log"
