"""Which finding of one scan is which finding of another: the baseline diff and `--fail-on-new`.

Findings match on category and innermost site (file, function, op), never on the line alone: an
unrelated edit above a finding moves its line. When a site holds several findings of one key (two
`.item()` calls in one function) the line decides, after correcting for the shift that the edit
caused: the median line shift of that function's unambiguous findings (one on each side).
"""

from __future__ import annotations

from collections import defaultdict
from statistics import median

__all__ = ["match"]


def _key(r: dict) -> tuple:
    return (r["category"], r["file"], r.get("function") or "", r["op"])


def _line(r: dict) -> int:
    return int(r.get("line") or 0)


def _caller_gap(c: dict, b: dict) -> tuple:
    """Ties on a library line are broken by the target's calling line: the same library read under two of the
    target's calls is two findings, and the one whose call was fixed is the one gone."""
    same = (c.get("caller_file") or "") == (b.get("caller_file") or "")
    return (not same, abs(int(c.get("caller_line") or 0) - int(b.get("caller_line") or 0)))


def _shifts(cur: dict, base: dict) -> dict:
    """(file, function) -> median line shift over keys with exactly one finding on each side."""
    seen = defaultdict(list)
    for k, cs in cur.items():
        bs = base.get(k, [])
        if len(cs) == 1 and len(bs) == 1:
            seen[(k[1], k[2])].append(_line(cs[0]) - _line(bs[0]))
    return {site: median(d) for site, d in seen.items()}


def match(cur: list[dict], base: list[dict]) -> tuple[list[dict], list[dict], list[tuple[dict, dict]]]:
    """(fixed: only in base, new: only in cur, remaining: (cur, base) pairs)."""
    by_c, by_b = defaultdict(list), defaultdict(list)
    for r in cur:
        by_c[_key(r)].append(r)
    for r in base:
        by_b[_key(r)].append(r)
    shift = _shifts(by_c, by_b)
    new, remaining, used = [], [], set()
    for k, cs in by_c.items():
        bs = by_b.get(k, [])
        s = shift.get((k[1], k[2]), 0)
        pairs = sorted(((abs(_line(c) - _line(b) - s), _caller_gap(c, b), i, j)
                        for i, c in enumerate(cs) for j, b in enumerate(bs)))
        taken_c, taken_b = set(), set()
        for _, _, i, j in pairs:
            if i not in taken_c and j not in taken_b:
                taken_c.add(i)
                taken_b.add(j)
                remaining.append((cs[i], bs[j]))
        new += [c for i, c in enumerate(cs) if i not in taken_c]
        used |= {id(bs[j]) for j in taken_b}
    fixed = [r for r in base if id(r) not in used]
    return fixed, new, remaining
