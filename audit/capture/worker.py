"""A disposable process for trial captures: `python -m audit.capture.worker`, JSON lines on stdin.

Why a process of its own: a capture invalidated by a sync leaves the process broken for every later
random op (docs/hazards.md), so in-process bisection would blame every module after the first failure.
The parent (`audit.capture.pool`) replaces this worker after any failed capture.

Protocol (one JSON object per line; responses on the original stdout, everything the target
prints goes to stderr):
  -> session   {"target": "dsv4:tiny" | "file.py:make", "path": "reference", "device": "cuda:0",
                "mode": "global", "warmup": 2, "steps": 3, "target_warmup": 2, "seed": 0,
                "stream_device": null, "root": null, "count_kernels": true, "requests": [...]?,
                "options": {"cache": "static", "batch": 1, "prompt_len": 8}?}
  <- ready     {"ready": true, "label", "layers_root", "layers", "device", "gpu_reserved"?, "gpu_free"?}
               or {"ready": false, "error"}
  -> request   {"module": "model.layers.2.attn"}  (null: the whole step)
  <- result    CaptureResult.to_dict()
With "requests" in the session, those are answered and the worker exits (one-shot use).
"""

from __future__ import annotations

import json
import os
import sys
import time

STEP = "<step>"


class Worker:
    def __init__(self, session: dict):
        self.session = session
        self.seed = int(session.get("seed", 0))
        self.options = dict(capture_error_mode=session.get("mode", "global"), warmup=int(session.get("warmup", 2)),
                            steps=int(session.get("steps", 3)), count_kernels=bool(session.get("count_kernels", True)))

    # ------------------------------------------------------------ setup
    def start(self) -> dict:
        """Builds the target, runs its warmup steps, learns which modules run, takes the base state."""
        import torch

        from audit.capture.record import CallWatch
        from audit.capture.state import Snapshot
        from audit.capture.modules import all_modules, find_layers
        from audit.target import resolve

        s = self.session
        torch.manual_seed(self.seed)
        self.device = torch.device(s.get("device", "cuda"))
        options = dict(s.get("options") or {})
        options.setdefault("max_new_tokens", 256)  # an hf: StaticCache holds every trial's steps (state is restored)
        resolved = resolve(s["target"], str(self.device), s.get("path", "reference"), options=options)
        self.obj, self.label, self.name = resolved.obj, resolved.label, resolved.name
        self.base = int(s.get("target_warmup", 2))
        for i in range(self.base):
            self.obj.prepare(i)
            self.obj.step()
        self._sync()
        self.s0 = Snapshot({"": self.obj})
        self.modules = all_modules(self.obj)
        with CallWatch(self.modules) as watch:
            self.obj.prepare(self.base)
            self.obj.step()
        self._sync()
        self.ran = {k for k, n in watch.called.items() if n}
        self.s0.restore()
        self.layers_root, self.layers = find_layers(self.obj, s.get("root"), self.ran)
        return {"label": self.label, "name": self.name, "layers_root": self.layers_root, "layers": self.layers,
                "device": str(self.device), "modules": len(self.modules)}

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _stream(self, device):
        """None (trial_capture makes one on the module's device) unless the session forces a device."""
        import torch

        sd = self.session.get("stream_device")
        if not sd or device.type != "cuda":
            return None
        with torch.cuda.device(torch.device(sd)):
            return torch.cuda.Stream(device=torch.device(sd))

    # ------------------------------------------------------------ one request
    def capture(self, path: str | None):
        from audit.capture.trial import CaptureResult

        t0 = time.perf_counter()
        try:
            res = self._capture_step() if path in (None, "", STEP) else self._capture_module(path)
        except Exception as e:  # the audit's own bookkeeping failed: report, never hang the parent
            from audit.capture.trial import _fail

            res = _fail(CaptureResult(path=path or STEP), "error", "record", e)
        res.seconds = round(time.perf_counter() - t0, 3)
        if res.status not in ("fail", "error"):
            self.s0.restore()
        return res

    def _annotate(self, watch):
        def annotate(exc, res):
            res.raised_in = watch.raised_in_chain(exc)
        return annotate

    def _capture_step(self):
        import torch

        from audit.capture.record import CallWatch
        from audit.capture.modules import resolve_module, source_info
        from audit.capture.trial import trial_capture

        self.s0.restore()
        obj, base = self.obj, self.base

        def feed(k: int) -> None:
            obj.prepare(base + k)

        with CallWatch(self.modules) as watch:
            res = trial_capture(obj.step, device=self.device, feed=feed, state={"": obj}, label=STEP,
                                stream=self._stream(self.device), annotate=self._annotate(watch), **self.options)
        res.path, res.module_type = STEP, type(obj).__name__
        res.children = []
        for p in self.layers:
            m = resolve_module(obj, p)
            res.children.append({"path": p, "type": type(m).__name__, "called": id(m) in self.ran})
        src = source_info(obj, "step") if isinstance(obj, torch.nn.Module) else _function_source(type(obj).step)
        res.source = src
        return res

    def _capture_module(self, path: str):
        import torch

        from audit.capture.record import CallWatch
        from audit.capture.state import RandomFeed
        from audit.capture.modules import module_device, resolve_module, source_info
        from audit.capture.trial import CaptureResult, trial_capture

        self.s0.restore()
        mod = resolve_module(self.obj, path)
        sub = dict(mod.named_modules(prefix=path))
        res = CaptureResult(path=path, module_type=type(mod).__name__)
        res.phase = "record"
        with CallWatch(sub, record=mod) as watch:
            self.obj.prepare(self.base)
            self.obj.step()
        self._sync()
        calls = watch.calls
        res.children = _children(mod, path, watch)
        res.source = source_info(mod, calls[0].method if calls else None)
        res.phase = None
        if not calls:
            res.status = "not-called"
            return res
        self.s0.restore()
        device = module_device(mod) or self.device
        static = [(c.args, c.kwargs) for c in calls]
        feed = RandomFeed(static, seed=self.seed)

        def fn():
            outs = []
            for c, (a, kw) in zip(calls, static):
                ctx = torch.inference_mode() if c.inference else torch.set_grad_enabled(c.grad)
                with ctx:
                    outs.append(getattr(mod, c.method)(*a, **kw))
            return outs

        with CallWatch(sub) as watch2:
            trial = trial_capture(fn, device=device, feed=feed, state={"": self.obj, "args": static}, label=path,
                                  stream=self._stream(device), annotate=self._annotate(watch2), **self.options)
        for k, v in trial.to_dict().items():
            if k not in ("path", "module_type", "children", "source"):
                setattr(res, k, v)
        return res


def _children(mod, path: str, watch) -> list[dict]:
    """Direct children (with whether they ran), then deeper modules this module's own code called
    directly (dsv4's attention calls `self.indexer.compressor.decode`, skipping the indexer):
    bisection must be able to reach those without going through a parent that passes."""
    from audit.capture.modules import children_of

    kids = children_of(mod, path)
    out = [{"path": p, "type": type(c).__name__, "called": watch.ran(c)} for p, c in kids]
    direct = {id(c) for _, c in kids} | {id(mod)}
    for p, m in watch.called_by(mod):
        if id(m) not in direct:
            out.append({"path": p, "type": type(m).__name__, "called": True, "direct_call": True})
    return out


def _function_source(fn) -> dict:
    import inspect

    info = {"class": None, "function": getattr(fn, "__name__", None), "file": None, "line": None, "ranges": []}
    try:
        lines, start = inspect.getsourcelines(fn)
        info.update(file=inspect.getsourcefile(fn), line=start, ranges=[[inspect.getsourcefile(fn), start,
                                                                         start + len(lines) - 1]])
    except (TypeError, OSError):
        pass
    return info


def _protocol_stream():
    """The real stdout for responses; fd 1 then points at stderr so stray prints cannot corrupt it."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


def _send(proto, obj: dict) -> None:
    proto.write(json.dumps(obj, default=str) + "\n")
    proto.flush()


def _gpu_memory(device) -> dict:
    """What the built target holds on its GPU and what is still free (the parent sizes a spare worker by it)."""
    import torch

    if not (isinstance(device, str) and device.startswith("cuda") and torch.cuda.is_available()):
        return {}
    dev = torch.device(device)
    return {"gpu_reserved": torch.cuda.memory_reserved(dev), "gpu_free": torch.cuda.mem_get_info(dev)[0]}


def main() -> int:
    proto = _protocol_stream()
    line = sys.stdin.readline()
    try:
        session = json.loads(line)
    except json.JSONDecodeError as e:
        _send(proto, {"ready": False, "error": f"bad session line: {e}"})
        return 2
    worker = Worker(session)
    try:
        info = worker.start()
    except Exception as e:
        from audit.capture.trial import classify_error, error_text, raised_at

        text = error_text(e)
        _send(proto, {"ready": False, "error": text[:2000], "error_class": classify_error(text),
                      "raised_at": raised_at(e)})
        return 1
    _send(proto, {"ready": True, **info, **_gpu_memory(session.get("device"))})
    requests = session.get("requests")
    source = iter(requests) if requests is not None else (json.loads(l) for l in sys.stdin if l.strip())
    for req in source:
        res = worker.capture(req.get("module"))
        _send(proto, res.to_dict())
        if res.status in ("fail", "error"):
            return 0  # the process may be poisoned: the parent starts a fresh one
    return 0


if __name__ == "__main__":
    sys.exit(main())
