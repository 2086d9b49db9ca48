"""inventory.sarif: the inventory as SARIF 2.1.0, the format code-scanning tools (GitHub's included) read.

One rule per category (its title, why it matters and the usual fix as help), one result per finding
at its innermost site, the caller site in the target's own files as a related location. A path
inside a git repository is written relative to that repository's root (the root of the scan's
working directory is %SRCROOT%, where GitHub resolves paths; another repository gets its own base
id); a file outside any repository (an installed library) keeps its path, as a file URI.
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

from audit.report.inventory import CATEGORIES, Inventory

__all__ = ["LEVELS", "SARIF_SCHEMA", "sarif"]

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
# both severities that make a graph unusable are errors; performance a warning; the rest notes
LEVELS = {"blocks-capture": "error", "silent-corruption": "error", "performance": "warning", "info": "note"}
SRCROOT = "%SRCROOT%"


@lru_cache(maxsize=None)
def git_root(directory: str) -> str | None:
    """The nearest enclosing directory holding .git (a directory, or a file for worktrees), or None."""
    d = Path(directory)
    for p in (d, *d.parents):
        if (p / ".git").exists():
            return str(p)
    return None


class _Locator:
    """Turns inventory paths (relative to the scan's working directory, or absolute) into artifact locations."""

    def __init__(self, cwd: str):
        self.cwd = os.path.realpath(cwd)
        self.roots: dict[str, str] = {}  # repository root -> uriBaseId
        main = git_root(self.cwd)
        if main:
            self.roots[main] = SRCROOT

    def __call__(self, file: str) -> dict:
        path = os.path.realpath(os.path.join(self.cwd, file))
        root = git_root(os.path.dirname(path))
        if root is None:
            return {"uri": Path(path).as_uri()}
        base = self.roots.setdefault(root, f"REPO{len(self.roots)}")
        return {"uri": Path(os.path.relpath(path, root)).as_posix(), "uriBaseId": base}

    def bases(self) -> dict:
        return {b: {"uri": Path(r).as_uri() + "/"} for r, b in self.roots.items()}


def _rule(cat) -> dict:
    return {
        "id": cat.id,
        "name": "".join(w.capitalize() for w in cat.id.split("-")),
        "shortDescription": {"text": cat.title},
        "fullDescription": {"text": cat.why},
        "help": {"text": f"{cat.why}\n\nUsual fix: {cat.fix}",
                 "markdown": f"**{cat.title}.** {cat.why}\n\n**Usual fix:** {cat.fix}"},
        "defaultConfiguration": {"level": LEVELS[cat.severity]},
        "properties": {"severity": cat.severity, "tags": ["cuda-graph", cat.severity]},
    }


def _location(loc: dict, line, function: str | None, module: str | None = None) -> dict:
    phys: dict = {"artifactLocation": loc}
    if line and int(line) > 0:
        phys["region"] = {"startLine": int(line)}
    out: dict = {"physicalLocation": phys}
    if function:
        out["logicalLocations"] = [{"name": function, "kind": "function",
                                    **({"fullyQualifiedName": f"{module}.{function}"} if module else {})}]
    return out


def _result(f: dict, index: dict, locate: _Locator) -> dict:
    cat = CATEGORIES[f["category"]]
    text = str(f.get("message") or cat.title)
    if f.get("fix") and f["fix"] != cat.fix:
        text = text.rstrip(".") + f". Fix: {f['fix']}"
    site = "|".join(str(f.get(k) or "") for k in ("category", "file", "function", "op"))
    res = {
        "ruleId": cat.id,
        "ruleIndex": index[cat.id],
        "level": LEVELS[f["severity"]],
        "message": {"text": text},
        "locations": [_location(locate(f["file"]), f.get("line"), f.get("function"), f.get("module"))],
        # line-free: GitHub keeps tracking the same alert when edits above it shift lines
        "partialFingerprints": {"dsv4AuditSite/v1": hashlib.sha256(site.encode()).hexdigest()[:32]},
        "properties": {k: f[k] for k in ("severity", "op", "count_per_step", "module") if f.get(k) not in (None, "")},
    }
    if f.get("caller_file"):
        rel = _location(locate(f["caller_file"]), f.get("caller_line"), f.get("caller_function"))
        rel.update(id=1, message={"text": f"called from {f.get('caller_function') or 'here'} (the target's own code)"})
        res["relatedLocations"] = [rel]
    return res


def sarif(inv: Inventory, cwd: str | None = None) -> dict:
    """The SARIF log of one inventory; paths resolve against `cwd` (default: the scan's, i.e. this process's)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        tool_version = version("dsv4-audit")
    except PackageNotFoundError:  # running from a source tree
        tool_version = "0"
    locate = _Locator(cwd or inv.meta.get("cwd") or os.getcwd())
    index = {c: i for i, c in enumerate(CATEGORIES)}
    results = [_result(f, index, locate) for f in inv.findings()]
    run: dict = {
        "tool": {"driver": {"name": "dsv4-audit", "version": tool_version, "semanticVersion": tool_version,
                            "rules": [_rule(c) for c in CATEGORIES.values()]}},
        "automationDetails": {"id": f"dsv4-audit/{inv.meta.get('name') or 'scan'}/"},
        "invocations": [{"executionSuccessful": not inv.meta.get("error"),
                         **({"toolExecutionNotifications": [{"level": "error", "message": {"text": inv.meta["error"]}}]}
                            if inv.meta.get("error") else {})}],
        "results": results,
    }
    if locate.roots:
        run["originalUriBaseIds"] = locate.bases()
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
