"""capture-failure: a torch optimizer whose step refuses to run under capture (`capturable=False`).

Adam, AdamW, NAdam, RAdam, Adamax, ASGD, RMSprop, Rprop and Adadelta check, at the top of `step()`,
whether the current stream is capturing; when it is and a param group was built without
`capturable=True`, they raise `RuntimeError: Attempting CUDA graph capture of step() for an instance of
Adam but param_groups' capturable is False`, whatever else the step does (`fused=True` included: a fused
step keeps its counter on the device but still refuses). A training step captured whole fails there.
The check reads no tensor, so nothing in the trace shows it: the rule reads the optimizer's flags and
the names its `step` calls, and reports the target's call of `opt.step()` (where torch.optim's
`record_function("Optimizer.step#Adam.step")` opened).
"""

from __future__ import annotations

import inspect

from audit.detectors import register
from audit.detectors.device.capturable_flags import gpu_capturable
from audit.detectors.device.optimizer_steps import optimizers

_ENTER = "profiler._record_function_enter_new"
_CHECKS = {"_accelerator_graph_capture_health_check", "_cuda_graph_capture_health_check"}
FIX = ("Build the optimizer with `capturable=True` (its step counter and bias correction then stay on the device; "
       "a tensor `lr` refilled in prepare() schedules it), or capture forward and backward only and run "
       "`opt.step()` eagerly after each replay.")


def _checking_steps(opt) -> set:
    """Code objects of the `step` methods in the optimizer's classes that run the capture health check."""
    codes = set()
    for cls in type(opt).__mro__:
        fn = cls.__dict__.get("step")
        code = getattr(inspect.unwrap(fn), "__code__", None) if callable(fn) else None
        if code is not None and _CHECKS & set(code.co_names):
            codes.add(code)
    return codes


@register("capture-failure")
def optimizer_refuses_capture(ctx):
    """An optimizer step that ran in the audited steps with a param group lacking `capturable=True`."""
    out = []
    for path, opt in optimizers(ctx):
        off = [i for i, g in enumerate(opt.param_groups) if not g.get("capturable", False)]
        codes = _checking_steps(opt)
        if not off or not codes or gpu_capturable(ctx, opt):  # `capturable=on_gpu`: a GPU builds it capturable
            continue
        name = type(opt).__name__
        label = f"Optimizer.step#{name}.step"  # the record_function torch.optim opens around every step()
        recs = [r for r in ctx.all_records() if r.op == _ENTER and r.args[:1] == (label,) and r.stack]
        for group in ctx.per_site(recs).values():
            fused = " (`fused=True` alone does not make it capturable)" if any(
                opt.param_groups[i].get("fused") for i in off) else ""
            msg = (f"`{name}.step` on `{path}` raises under capture: param group(s) {off} have capturable=False"
                   f"{fused}, and torch.optim refuses a graph capture of such a step (\"Attempting CUDA graph "
                   f"capture of step() for an instance of {name} but param_groups' capturable is False\")")
            out.append(ctx.finding("capture-failure", group[0], f"{name}.step", len(group) / ctx.n_steps, msg, fix=FIX))
    return out
