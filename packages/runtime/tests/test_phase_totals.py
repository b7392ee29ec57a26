"""``compile_timer.phase_totals``: seconds per phase summed over a model's graphs (what the
benchmarks print as "where kiln's cold compile went")."""

from __future__ import annotations

from kiln_runtime import compile_timer
from kiln_runtime.compile_timer import CompileReport


def test_phases_are_summed_over_reports_largest_first():
    a, b = CompileReport("forward"), CompileReport("backward")
    a.phases.update({"trace": 0.5, "kernel compile": 1.0})
    b.phases.update({"trace": 0.75, "lower": 0.25})
    totals = compile_timer.phase_totals([a, b])
    assert totals == {"trace": 1.25, "kernel compile": 1.0, "lower": 0.25}
    assert list(totals) == ["trace", "kernel compile", "lower"]


def test_by_default_the_reports_kept_so_far():
    compile_timer.reset_reports()
    assert compile_timer.phase_totals() == {}
    with compile_timer.graph("g"), compile_timer.phase("lower"):
        pass
    assert list(compile_timer.phase_totals()) == ["lower"]
    compile_timer.reset_reports()
