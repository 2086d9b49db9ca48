"""A read a boolean chain evaluates only after a device test that stops it on a GPU is the CPU's alone.

sentence-transformers' maxsim warns about empty documents behind `not compiling() and empty.device.type ==
"cpu" and empty.any()`: on a GPU the device test is False and `and` stops before `empty.any()`; a CPU scan
runs the read. So it is info naming the test, as for a read in the CPU's side of an `if`. The same holds for
`x.is_cuda or ...`, and for the body of an `if` whose `and` test holds such a conjunct. A read before the device
test in the chain, elsewhere in the statement on that line, or after a test the device does not settle, stays a
hazard.
"""

from __future__ import annotations

import random

import pytest

from site_util import HELPER_LIB, helper_reads

FORMS = {  # (helper body, the read runs on the CPU's side only)
    "and-after-test": ('if not _compiling() and z.device.type == "cpu" and z.abs().max() > {t}:  # LIBSITE\n'
                       "        z = z * 0.5\n    return z", True),
    "or-after-cuda": ("if z.is_cuda or bool(z.abs().max() > {t}):  # LIBSITE\n        z = z * 0.5\n    return z",
                      True),
    "and-body": ('if z.device.type == "cpu" and _enabled():\n        n = int(z.abs().max() > {t})  # LIBSITE\n'
                 "        z = z * (1 + n)\n    return z", True),
    "read-before-test": ('if z.abs().max() > {t} and z.device.type == "cpu":  # LIBSITE\n        z = z * 0.5\n'
                         "    return z", False),
    "statement-reads-too": ("n = int(z.abs().sum() > {t}) + int(z.is_cpu and bool(z.abs().max() > {t}))  # LIBSITE\n"
                            "    return z * (1 + n)", False),
    "mps-test": ('if z.device.type != "mps" and z.abs().max() > {t}:  # LIBSITE\n        z = z * 0.5\n    return z',
                 False),
}

PRELUDE = "\n\ndef _compiling():\n    return False\n\n\ndef _enabled():\n    return True\n"


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_read_after_a_short_circuiting_device_test_is_info(tmp_path, monkeypatch, form):
    body, cpu_only = FORMS[form]
    src = HELPER_LIB.format(body=body.format(t=round(random.uniform(0.2, 0.8), 3))) + PRELUDE
    hit = helper_reads(tmp_path, monkeypatch, src, "short_circuit_lib")
    if cpu_only:
        assert (hit.severity == "info").all() and hit.message.str.contains("on the CPU only").all(), hit.to_string()
    else:
        assert (hit.severity == "blocks-capture").any(), hit.to_string()
