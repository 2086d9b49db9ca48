"""Parent side of isolated trial captures: one worker process at a time, replaced after any failure.

Building the target and warming it up costs seconds, so a worker that keeps passing answers many
requests. A failed capture may have poisoned its process (docs/hazards.md: an invalidated capture
breaks every later random op), so after a `fail` or `error` result, a crash or a timeout the
worker is discarded and the next request starts a fresh one. On a GPU with room for a second
copy of the target, a spare worker is built while the current one answers, so a bisection of a
path with many failing leaves waits for a process start once, not once per failure.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

from audit.capture.trial import CaptureResult, classify_error, first_line
from audit.errors import AuditError

__all__ = ["CapturePool", "worker_env"]

_REPO = Path(__file__).resolve().parent.parent


def worker_env() -> dict:
    """The parent's environment with the repository importable (audit, dsv4, cli), and the folders the
    parent put on sys.path at run time (a target's folder, a site dir added by hand: pkg.module targets)."""
    env = dict(os.environ)
    prefixes = tuple(os.path.join(os.path.realpath(p), "") for p in {sys.prefix, sys.base_prefix})
    extra = [p for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p)
             and not os.path.join(os.path.realpath(p), "").startswith(prefixes)]
    parts = [str(_REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + extra
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _absolute_target(target: str) -> str:
    """file.py:factory and hf:DIR relative to the parent's cwd -> absolute (the worker may run elsewhere)."""
    if isinstance(target, str) and target.startswith("hf:"):
        return f"hf:{Path(target[3:]).expanduser().resolve()}" if Path(target[3:]).expanduser().exists() else target
    if isinstance(target, str) and not target.startswith("dsv4:") and ":" in target:
        file, _, factory = target.rpartition(":")
        if file and Path(file).is_file():
            return f"{Path(file).resolve()}:{factory}"
    return target


class CapturePool:
    """`pool.capture("model.layers.2.attn")` -> CaptureResult; `pool.capture(None)`: the whole step."""

    def __init__(self, session: dict, timeout: float = 600.0, python: str = sys.executable):
        self.session = dict(session, target=_absolute_target(session["target"]))
        self.session.pop("requests", None)
        self.timeout, self.python = timeout, python
        self.proc: subprocess.Popen | None = None
        self.info: dict | None = None
        self.spawned = 0
        self.served = 0
        self._err = None
        self._spare: tuple | None = None  # (process, stderr file) already sent the session
        self._timed_out = False

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> "CapturePool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        _discard(self._spare)
        self._spare = None

    def start(self) -> dict:
        """Starts a worker (if none runs) and returns its ready info; AuditError if the target fails."""
        if self.proc is not None and self.proc.poll() is None:
            return self.info
        spare, self._spare = self._spare, None
        if spare is not None and spare[0].poll() is None:
            self.proc, self._err = spare
        else:
            _discard(spare)
            self.proc, self._err = self._spawn()
        self.served = 0
        msg = self._read()
        if msg is None or not msg.get("ready"):
            why = (msg or {}).get("error") or self._crash_note()
            self.close()
            raise AuditError(f"capture worker could not start the target: {first_line(why)}")
        self.info = msg
        if _room_for_another(msg):
            self._spare = self._spawn()
        return msg

    def _spawn(self) -> tuple:
        err = tempfile.TemporaryFile(mode="w+b")
        proc = subprocess.Popen([self.python, "-m", "audit.capture.worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, cwd=str(_REPO), env=worker_env())
        self.spawned += 1
        proc.stdin.write((json.dumps(self.session) + "\n").encode())
        proc.stdin.flush()
        return proc, err

    def close(self) -> None:
        p, self.proc = self.proc, None
        err, self._err = self._err, None
        if p is not None:
            _discard((p, err))
        elif err is not None:
            err.close()

    # ------------------------------------------------------------ requests
    def capture(self, module: str | None) -> CaptureResult:
        """One trial. A failure that is not clearly the program's (class other / illegal-op) in a
        worker that already ran trials is re-tried once in a fresh worker: earlier trials (profiler
        sessions, graphs) must not be able to fake a capture failure."""
        served = self.served if self.proc is not None and self.proc.poll() is None else 0
        res = self._capture_once(module)
        if res.status == "fail" and res.error_class in ("other", "illegal-op") and served > 0:
            again = self._capture_once(module)
            again.warnings.append(f"re-tried in a fresh worker (first attempt: {first_line(res.error or '', 120)})")
            return again
        return res

    def _capture_once(self, module: str | None) -> CaptureResult:
        path = module or "<step>"
        self.start()
        self.served += 1
        try:
            self._write({"module": module})
        except (BrokenPipeError, OSError):
            return self._crashed(path)
        msg = self._read()
        if msg is None:
            return self._crashed(path)
        res = CaptureResult.from_dict(msg)
        if res.status in ("fail", "error"):
            self.close()  # possibly poisoned: the next request gets a fresh worker
        return res

    def _crashed(self, path: str) -> CaptureResult:
        note = self._crash_note()
        self.close()
        return CaptureResult(path=path, status="fail", phase="capture", error=note, error_class=classify_error(note))

    # ------------------------------------------------------------ pipes
    def _write(self, obj: dict) -> None:
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def _read(self) -> dict | None:
        """One response line, or None on EOF / timeout (the worker is killed on timeout)."""
        out = self.proc.stdout
        ready, _, _ = select.select([out], [], [], self.timeout)
        if not ready:
            self.proc.kill()
            self.proc.wait()
            self._timed_out = True
            return None
        line = out.readline()
        if not line:
            return None
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            return None

    def _crash_note(self) -> str:
        """Why the worker stopped answering: exit code / timeout plus the tail of its stderr."""
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
        if self._timed_out:
            self._timed_out = False
            head = f"worker timed out after {self.timeout:.0f} s"
        else:
            head = f"worker died (exit code {code})" if code is not None else "worker stopped answering"
        tail = ""
        if self._err is not None:
            try:
                self._err.seek(0, 2)
                size = self._err.tell()
                self._err.seek(max(0, size - 4000))
                tail = self._err.read().decode(errors="replace").strip()
            except OSError:
                pass
        lines = [l for l in tail.splitlines() if l.strip()]
        return head + (": " + " | ".join(lines[-6:]) if lines else "")


def _room_for_another(info: dict) -> bool:
    """A spare copy of the target fits: the worker's reserved GPU memory is under a third of what is free."""
    used, free = info.get("gpu_reserved"), info.get("gpu_free")
    return bool(used) and bool(free) and 3 * used < free


def _discard(spare: tuple | None) -> None:
    if spare is None:
        return
    proc, err = spare
    try:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=10)
    except Exception:
        proc.kill()
        proc.wait()
    for f in (proc.stdout, err):
        if f:
            f.close()
