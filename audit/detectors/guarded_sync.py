"""host-sync the run could not see: waits in device-guarded branches a CPU scan never takes.

`if x.is_cuda: torch.cuda.synchronize()` runs nothing on the CPU, so a CPU scan traces no wait,
yet on the GPU that branch runs inside the captured region and capture fails. For every user
function the step ran, we read its source and report the synchronizing calls inside an `if`
that tests the device whose branch ran no op during the scan. The test is read structurally
(_scopes.device_test): `x.device != torch.device("cpu")`, `x.is_cuda`, `torch.cuda.*()`, or a flag
assigned such a test (`self.on_accelerator = device != "cpu"`); a test on ordinary data is not one.
CUDA scans skip this rule: there the branch either ran (and was traced) or is not taken.
"""

from __future__ import annotations

import ast

from audit.detectors import _scopes, _source, register

SYNC_CALLS = {"synchronize", "item", "tolist", "cpu", "numpy", "query"}


def _guarded(file: str, test: ast.AST) -> bool:
    """Whether the `if` test picks a side by device (so a CPU scan only ever runs one side)."""
    tree = _source.tree(file)
    return tree is not None and _scopes.device_test(tree, test)


def _ran(ctx) -> tuple[dict, set]:
    """The target's own functions (by file and first line) and the (file, line) pairs that
    dispatched an op. Library code is not read: its device branches are its authors' business."""
    funcs, lines = {}, set()
    for s in ctx.complete:
        for r in ctx.steps[s]:
            for code, line in r.stack:
                if ctx.trace.is_own(code):
                    funcs[(code.co_filename, code.co_firstlineno)] = code.co_name
                lines.add((code.co_filename, line))
    return funcs, lines


def _untaken(node: ast.If, file: str, lines: set):
    """The statements of whichever side of `node` ran no op in the scan (and could run under capture)."""
    for body, safe in zip((node.body, node.orelse), _source.skipped_under_capture(node.test)):
        if body and not safe and not any((file, n) in lines for st in body
                            for n in range(st.lineno, (st.end_lineno or st.lineno) + 1)):
            yield from body


@register("host-sync")
def syncs_in_untaken_device_branches(ctx):
    """On a CPU scan: synchronizing calls in device-guarded branches of code the step ran."""
    if ctx.cuda:
        return []
    funcs, lines = _ran(ctx)
    out, seen = [], set()
    for (file, first), name in funcs.items():
        func = _source.enclosing_function(file, first + 1)
        if func is None or getattr(func, "name", None) != name:
            continue
        for node in ast.walk(func):
            if not (isinstance(node, ast.If) and _guarded(file, node.test)):
                continue
            for st in _untaken(node, file, lines):
                for call in ast.walk(st):
                    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                            and call.func.attr in SYNC_CALLS and (file, call.lineno) not in seen):
                        seen.add((file, call.lineno))
                        what = ast.unparse(call.func)
                        out.append(ctx.finding(
                            "host-sync", (file, call.lineno, name), what, 0.0,
                            f"`{what}()` sits in a branch guarded by `{ast.unparse(node.test)}` that this CPU "
                            "scan did not take; on the GPU it waits for the device inside the step "
                            "(found in the source, not traced)",
                            fix="Remove the wait from the step, or move it outside the captured region."))
    return out
