"""The top-k select kernel's launch settings timed on the GPU at the indexer's decode shapes: a row
just past a power of two as that power plus a tail block, or as one block of the next power; warps
per program. Each setting is checked against torch.topk first (same value set, values at their
indices), then timed as 200 calls in one CUDA graph. Prints a table; writes $OUT/topk_sweep.json.
Run: python tests/gpu_topk_sweep.py
"""

from __future__ import annotations

import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from test_topk_gpu import _us_per_call  # noqa: E402

from dsv4.kernels import _triton_topk as tk  # noqa: E402

SHAPES = [(1, 4096, 512), (1, 4132, 512), (16, 4132, 512), (1, 5000, 512), (1, 8200, 512), (1, 16384, 512)]


def main() -> None:
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    xs = {s: torch.randn(s[0], s[1], generator=gen).cuda() for s in SHAPES}
    rule, fraction = tk.launch_config, tk.TAIL_MAX_FRACTION
    rows = []
    for tail, warps in itertools.product((True, False), (0, 4, 8, 16)):
        tk.TAIL_MAX_FRACTION = fraction if tail else 1 << 30
        tk.launch_config = (lambda n, k, w=warps: (*rule(n, k)[:4], w or rule(n, k)[4]))
        for (R, n, k), x in xs.items():
            v, i = tk.topk(x, k)
            ref = torch.topk(x, k, dim=-1).values
            ok = torch.equal(v.sort(-1).values, ref.sort(-1).values) and torch.equal(x.gather(-1, i), v)
            us = _us_per_call(lambda: tk.topk(x, k))
            _, block, nchunk, t, w = tk.launch_config(n, k)
            rows.append(dict(tail=t, block=block, nchunk=nchunk, warps=w, rule=warps == 0, R=R, n=n, k=k,
                             us=round(us, 2), ok=ok))
    tk.launch_config, tk.TAIL_MAX_FRACTION = rule, fraction
    for (R, n, k), x in xs.items():
        rows.append(dict(tail="torch", block="", nchunk="", warps="", rule="", R=R, n=n, k=k,
                         us=round(_us_per_call(lambda: torch.topk(x, k, dim=-1)), 2), ok=True))
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "topk_sweep.json"), "w") as f:
        json.dump(rows, f, indent=1)
    for r in sorted(rows, key=lambda r: (r["n"], r["R"], r["us"])):
        print(f"R={r['R']:<3} n={r['n']:<6} block={r['block']!s:5} tail={r['tail']!s:5} chunks={r['nchunk']!s:2} "
              f"warps={r['warps']!s:3}{'*' if r['rule'] else ' '} {r['us']:8.2f} us {'ok' if r['ok'] else 'WRONG'}")


if __name__ == "__main__":
    main()
