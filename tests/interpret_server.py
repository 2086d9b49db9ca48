"""One warm Python per test process for the kernels' Triton-interpreter tests.

Every case needs a process of its own with TRITON_INTERPRET set before a kernel is defined, and a case's body may
change module settings (`T.TARGET_PROGRAMS = 1`). A fresh interpreter per case spends most of a short case importing
torch and Triton, so this process imports them once and forks a child per case: each child is a clean copy of the
warm process and dies with whatever its body changed. Run as a script: reads one JSON request per line ({"code",
"out"}) and answers the child's exit status; the child's output goes to the file `out`. One thread only: a process
that forks must not have started a thread pool (OMP_NUM_THREADS=1 comes with the environment)."""

import json
import os
import sys
import traceback

import torch
import triton.runtime.interpreter

import dsv4.kernels

_WARM = (torch, triton.runtime.interpreter, dsv4.kernels)  # imported once, before the forks


def _child(code: str, out: str) -> None:
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    status = 0
    try:
        exec(compile(code, "<interpreted case>", "exec"), {"__name__": "__main__"})
    except BaseException:  # noqa: BLE001 - the case's failure is its report
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main() -> None:
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req["code"], req["out"])
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


if __name__ == "__main__":
    main()
