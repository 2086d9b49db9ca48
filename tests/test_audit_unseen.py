"""Hazard forms written the way unseen user code writes them, each at its exact line, with a clean twin.

The planted files mark hazard lines with `# HAZARD: <category>` (as tests/planted/ does); the
targets draw fresh random data every run, so a scan that finds them does so on new inputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import audit
from test_audit_planted import BLOCKING, markers

PLANTED = Path(__file__).parent / "planted"
FORMS = ["control_guards", "control_dispatch", "control_picked", "control_named", "control_sorted",
         "control_experts", "host_reads_unseen", "host_data_staging", "host_state_unseen",
         "host_state_hidden", "host_state_attached", "host_state_shapes", "host_state_stdlib",
         "capture_guard", "device_flags", "rng_reseed", "streams_cached", "host_reads_aliased",
         "host_state_buffers", "control_slices", "host_state_callbacks", "host_data_fields", "host_state_ipc",
         "host_state_bound", "rng_fresh", "host_data_derived",
         "host_reads_config", "control_paths", "control_modes", "host_index", "script_fused",
         "host_scalar_operands"]


def _scan(name: str, factory: str):
    return audit.scan(f"{PLANTED / name}.py:{factory}", device="cpu", steps=6)


@pytest.mark.parametrize("name", FORMS)
def test_each_form_found_at_its_line_and_nothing_else(name):
    path = PLANTED / f"{name}.py"
    inv = _scan(name, "make")
    bad = inv.df[inv.df.severity.isin(BLOCKING) & inv.df.file.astype(str).str.endswith(f"planted/{name}.py")]
    got = set(zip(bad.line.astype(int), bad.category))
    expected = markers(path)
    assert expected <= got, f"missing: {sorted(expected - got)}\n{bad[['line', 'category', 'message']].to_string()}"
    assert got <= expected, f"unmarked: {sorted(got - expected)}\n{bad[['line', 'category', 'message']].to_string()}"


@pytest.mark.parametrize("name", FORMS)
def test_clean_twin_is_graph_ready(name):
    inv = _scan(name, "make_clean")
    bad = inv.df[inv.df.severity.isin(BLOCKING)]
    assert bad.empty, bad[["file", "line", "category", "message"]].to_string()


def test_expert_dispatch_is_blamed_on_the_guard_that_skips_experts():
    """Steps that differ only in which expert ran: the finding sits on the dispatch loop's guard
    (`if counts[e] == 0: continue`), never inside the expert's own code, which both steps ran the
    same way, nor on the `for` line, whose trip count is fixed."""
    path = PLANTED / "control_experts.py"
    guard = next(n for n, c in markers(path) if c == "data-dependent-control")
    for _ in range(3):  # fresh routing each scan
        inv = _scan("control_experts", "make")
        rows = inv.df[inv.df.category == "data-dependent-control"]
        assert set(rows.line.astype(int)) == {guard}, rows[["line", "message"]].to_string()


def test_bookkeeping_a_capture_never_runs_is_info():
    """`self.eager_steps += 1` under `if not torch.cuda.is_current_stream_capturing():` changes Python
    state on eager steps only: reported at its line as info, never as silent corruption."""
    path = PLANTED / "capture_guard.py"
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "self.eager_steps += 1" in text)
    inv = _scan("capture_guard", "make")
    rows = inv.df[(inv.df.category == "cpu-side-effect") & (inv.df.line.astype(int) == line)]
    assert list(rows.severity) == ["info"], inv.df[["line", "category", "severity"]].to_string()
    assert "counts eager steps only" in rows.message.iloc[0]


def test_state_changed_inside_a_stdlib_class_is_blamed_on_the_users_call():
    """A queue.Queue's put_nowait mutates it in queue.py, whose frames are hidden: the finding sits on
    the user's call into the queue, never on stdlib lines (let alone functions that did not run)."""
    path = PLANTED / "host_state_stdlib.py"
    inv = _scan("host_state_stdlib", "make")
    rows = inv.df[inv.df.category == "cpu-side-effect"]
    outside = rows[~rows.file.astype(str).str.endswith("planted/host_state_stdlib.py")]
    assert outside.empty, outside[["file", "line", "function", "message"]].to_string()
    lines = path.read_text().splitlines()
    for n, text in enumerate(lines, 1):
        if "put_nowait" in text and "HAZARD" in text:
            msg = rows[rows.line.astype(int) == n].message
            assert len(msg) == 1 and "queue.Queue" in msg.iloc[0], (n, rows[["line", "message"]].to_string())


def test_each_line_of_a_dict_names_the_key_it_changes():
    """Two keys of one dict changed on two lines: each finding describes its own line's element."""
    path = PLANTED / "host_state_stdlib.py"
    inv = _scan("host_state_stdlib", "make")
    rows = inv.df[inv.df.category == "cpu-side-effect"]
    for key in ("dropped", "active"):
        n = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if f'self.stats["{key}"]' in text
                 and "HAZARD" in text)
        msg = rows[rows.line.astype(int) == n].message
        assert len(msg) == 1 and f"stats['{key}']" in msg.iloc[0], (key, rows[["line", "message"]].to_string())


def test_a_config_field_names_the_cpu_only_when_it_is_not_the_compute_device():
    """`.to(self.cfg.spill_device)` with the field's only value "cpu" reads the CPU; a field named `device`
    with the default "cpu" does not (a launcher in another file sets it to the GPU)."""
    import ast
    import textwrap

    from audit.detectors.source.scopes import names_cpu

    def reads_cpu(field: str) -> bool:
        src = textwrap.dedent(f"""
            import dataclasses
            @dataclasses.dataclass
            class Cfg:
                {field}: str = "cpu"
            class Step:
                def __init__(self):
                    self.cfg = Cfg()
                def step(self, t):
                    return t.to(self.cfg.{field})
        """)
        tree = ast.parse(src)
        call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "to")
        return names_cpu(tree, call.args[0], call.lineno)

    assert reads_cpu("spill_device") and reads_cpu("offload_device")
    assert not reads_cpu("device") and not reads_cpu("compute_device")
