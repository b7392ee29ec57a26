"""Where cold compile time goes: named phases timed per compiled graph (``KILN_LOGS=perf``).

    with compile_timer.graph("forward"):          # one report per compiled graph
        with compile_timer.phase("aot trace"):
            ...
        with compile_timer.phase("kernel compile"):
            with compile_timer.phase("autotune"):  # nested: counted once, under "autotune"
                ...

A phase's time is its *own* time: a phase nested in another is subtracted from the outer
one, so the phases of a report add up to the graph's total. ``add(name, seconds)`` books
time measured elsewhere (the frontend's capture, timed before the backend runs). Outside a
``graph(...)`` block phases cost one ``perf_counter`` pair and are dropped.

Reports: ``reports()`` (the last ``MAX_REPORTS``, oldest first), ``last_report()`` and
``phase_totals()`` (seconds per phase over the reports); with
``KILN_LOGS=perf`` each report is printed to stderr when its graph is done.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
from collections.abc import Iterator

from .logs import log_enabled

__all__ = [
    "CompileReport", "add", "graph", "last_report", "note", "phase", "phase_totals", "reports",
    "reset_reports",
]

MAX_REPORTS = 256


@dataclasses.dataclass
class CompileReport:
    """One graph's compile: ``phases`` (name -> own seconds, in first-seen order),
    ``total`` (wall seconds of the ``graph`` block plus time booked with ``add``) and
    ``notes`` (e.g. ``"graph cache hit"``)."""

    label: str
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    total: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        extra = f" ({', '.join(self.notes)})" if self.notes else ""
        lines = [f"[kiln.perf] compile of {self.label}: {self.total:.3f} s{extra}"]
        for name, sec in self.phases.items():
            share = 100.0 * sec / self.total if self.total > 0 else 0.0
            lines.append(f"    {name:<24} {sec:8.3f} s {share:5.1f}%")
        accounted = sum(self.phases.values())
        if self.total - accounted > 0.0005:
            other = self.total - accounted
            lines.append(f"    {'(other)':<24} {other:8.3f} s {100.0 * other / self.total:5.1f}%")
        return "\n".join(lines)


class _State(threading.local):
    def __init__(self) -> None:
        self.report: CompileReport | None = None
        self.stack: list[list[float]] = []  # per open phase: [child seconds]


_state = _State()
_reports: list[CompileReport] = []
_lock = threading.Lock()


@contextlib.contextmanager
def graph(label: str) -> Iterator[CompileReport]:
    """Collect the phases run inside into one report (nested ``graph`` blocks join the outer
    report)."""
    if _state.report is not None:
        yield _state.report
        return
    report = CompileReport(label)
    _state.report, saved_stack = report, _state.stack
    _state.stack = []
    start = time.perf_counter()
    try:
        yield report
    finally:
        report.total += time.perf_counter() - start
        _state.report, _state.stack = None, saved_stack
        with _lock:
            _reports.append(report)
            del _reports[:-MAX_REPORTS]
        if log_enabled("perf"):
            print(report, file=sys.stderr, flush=True)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as phase ``name`` of the current graph's report (own time only)."""
    report = _state.report
    if report is None:
        yield
        return
    children = [0.0]
    _state.stack.append(children)
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        _state.stack.pop()
        if _state.stack:
            _state.stack[-1][0] += elapsed
        report.phases[name] = report.phases.get(name, 0.0) + elapsed - children[0]


def add(name: str, seconds: float) -> None:
    """Book ``seconds`` measured outside the graph block (e.g. capture) under ``name``."""
    report = _state.report
    if report is None or seconds <= 0:
        return
    report.phases[name] = report.phases.get(name, 0.0) + seconds
    report.total += seconds


def note(text: str) -> None:
    """Attach a note to the current report (printed after its total)."""
    if _state.report is not None and text not in _state.report.notes:
        _state.report.notes.append(text)


def reports() -> list[CompileReport]:
    with _lock:
        return list(_reports)


def phase_totals(of: list[CompileReport] | None = None) -> dict[str, float]:
    """Seconds per phase summed over reports (default: ``reports()``), largest first: where
    the compiles of a model went, over all its graphs."""
    totals: dict[str, float] = {}
    for report in reports() if of is None else of:
        for name, seconds in report.phases.items():
            totals[name] = totals.get(name, 0.0) + seconds
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def last_report() -> CompileReport | None:
    with _lock:
        return _reports[-1] if _reports else None


def reset_reports() -> None:
    with _lock:
        _reports.clear()
