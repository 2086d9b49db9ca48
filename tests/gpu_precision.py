"""Precision of `scan --device cuda` over the planted suite (issue 14, point 3), next to the CPU scan.

For every planted target: findings that are not info and whose (line, category) is not planted
(off-plant), and planted hazards the CPU scan finds that the CUDA scan misses. Needs CUDA.
    python tests/gpu_precision.py [--json FILE]        (the table comes last)
A target whose own code cannot run on one device (a CPU generator fed to a CUDA op) is reported
with its error; what it traced before failing still counts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "planted_gpu"))
SITE = str(HERE / "planted_site")  # plantedlib, the "installed" package library_frames.py calls
from markers import markers  # noqa: E402

# planted_gpu files of the capture tests mark one line with `# PLANT` (one category per file)
PLANT = {"host_sync.py": "host-sync", "unpinned_copy.py": "pageable-copy", "baked_pos.py": "baked-host-value",
         "wrong_device.py": None}
OWN = {"cuda_waits.py": ("make", "make_clean", "make_first_call_only"),
       "streams.py": ("make", "make_no_join", "make_event_no_join", "make_no_wait", "make_clean", "make_clean_events")}


def targets() -> list[tuple[Path, str]]:
    out = []
    for p in sorted((HERE / "planted").glob("*.py")):
        out += [(p, f) for f in ("make", "make_clean") if f"def {f}(" in p.read_text()]
    out += [(HERE / "planted_gpu" / n, f) for n, facs in OWN.items() for f in facs]
    out += [(HERE / "planted_gpu" / n, "make") for n in PLANT]
    return out


def planted(path: Path, cuda: bool = False) -> set[tuple[int, str]]:
    out = markers(path, cuda=cuda)
    if path.parent.name == "planted_gpu" and path.name in PLANT:
        cat = PLANT[path.name]
        out |= {(n, cat) for n, t in enumerate(path.read_text().splitlines(), 1) if cat and "# PLANT" in t}
    return out


def scan_one(path: Path, factory: str, device: str):
    """(inventory or None, error text or None)."""
    import audit
    from audit.errors import TargetFailed

    try:
        return audit.scan(f"{path}:{factory}", device=device), None
    except TargetFailed as e:
        return e.inventory, str(e).splitlines()[0][:200]
    except Exception as e:  # noqa: BLE001 - cannot be built on this device: reported, not counted
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def _expected(file: str, target: Path, cuda: bool) -> set[tuple[int, str]]:
    """The planted (line, category) pairs of the file a finding names: the target's own file, or a
    planted library file (tests/planted_site/...) it calls; other files expect nothing."""
    if file.endswith(f"{target.parent.name}/{target.name}"):
        return planted(target, cuda)
    lib = HERE.parent / file
    return markers(lib, cuda=cuda) if file.startswith("tests/planted_site/") and lib.is_file() else set()


def measure(path: Path, factory: str, devices=("cpu", "cuda")) -> dict:
    name = f"{path.parent.name}/{path.name}"
    res: dict = {"target": f"{name}:{factory}"}
    for dev in devices:
        inv, err = scan_one(path, factory, dev)
        if inv is None:
            res[dev] = {"error": err, "off_plant": [], "found": []}
            continue
        df = inv.df[inv.df.severity != "info"] if len(inv) else inv.df
        rows = list(zip(df.file.astype(str), df.line.astype(int), df.category, df.op)) if len(df) else []
        # only our own files are judged here (tests/...); other libraries (transformers) by their own tests
        mine = [r for r in rows if r[0].startswith("tests/") or r[0].endswith(name)]
        hit = {r for r in mine if (r[1], r[2]) in _expected(r[0], path, dev != "cpu")}
        off = [r for r in mine if r not in hit]
        found = sorted({(r[0].split("tests/")[-1], r[1], r[2]) for r in hit})
        res[dev] = {"error": err, "off_plant": [list(map(str, r)) for r in off], "found": found}
    if len(devices) == 2:
        a, b = (set(map(tuple, res[d]["found"])) for d in devices)
        res["missed_on_cuda"] = sorted(a - b)
    return res


def measure_all(progress: bool = False) -> list[dict]:
    """Every planted target, with plantedlib importable for the scans only (other tests install
    their own shifted copy of it). `progress` names each target on stderr as it starts, so a run cut
    short by a time limit says where it was."""
    sys.path.insert(0, SITE)
    try:
        rows = []
        for n, (p, f) in enumerate(targets(), 1):
            if progress:
                print(f"[{n}] {p.parent.name}/{p.name}:{f}", file=sys.stderr, flush=True)
            rows.append(measure(p, f))
        return rows
    finally:
        sys.path.remove(SITE)
        for name in [m for m in sys.modules if m == "plantedlib" or m.startswith("plantedlib.")]:
            del sys.modules[name]


def report(rows: list[dict], json_path: str | None = None) -> None:
    """The table (one line per target, each CUDA finding off its plants under it), TOTAL last."""
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1, default=str))
    print(f"{'target':58} {'cpu off':>7} {'cuda off':>8} {'missed':>6}  cuda error")
    for r in rows:
        print(f"{r['target']:58} {len(r['cpu']['off_plant']):7d} {len(r['cuda']['off_plant']):8d} "
              f"{len(r['missed_on_cuda']):6d}  {(r['cuda']['error'] or '')[:70]}")
        for o in r["cuda"]["off_plant"]:
            print(f"    cuda off-plant: {o[0].split('/')[-1]}:{o[1]} {o[2]} {o[3]}")
    cpu_off = sum(len(r["cpu"]["off_plant"]) for r in rows)
    cuda_off = sum(len(r["cuda"]["off_plant"]) for r in rows)
    missed = sum(len(r["missed_on_cuda"]) for r in rows)
    print(f"TOTAL targets={len(rows)} cpu_off_plant={cpu_off} cuda_off_plant={cuda_off} missed_on_cuda={missed}")


def main(argv: list[str]) -> int:
    report(measure_all(progress=True), argv[argv.index("--json") + 1] if "--json" in argv else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
