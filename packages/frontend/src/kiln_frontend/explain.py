"""``explain(fn)(*args)``: run ``fn`` once under kiln's frontend and say what it captured.

    out = kiln_frontend.explain(toy_example)(a, b)
    print(out)          # graphs, graph breaks with reasons and file:line, ops, guards
    out.graph_count, out.graph_break_count, out.break_reasons, out.ops_per_graph, ...

It forgets everything compiled so far (``reset()``), so every frame ``fn`` runs is captured
afresh, with a backend that records the graphs and runs them as they are (``eager``).
Graph breaks come from two places: a frame that was compiled in pieces (its break reason is
the instruction that could not be captured) and a frame that could not be captured at all
(it runs as plain Python; the reason says why).  Kept apart from graph breaks: frames not
captured at all because of where their code lives (``skipped_frames``: torch's own files,
the standard library...) and kiln's own failures (``internal_errors``: bugs in kiln, after
which the frame ran eagerly).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch.fx

from .exc import BUG_REPORT_HINT, InternalError, Unsupported
from .guards import Guard

__all__ = ["ExplainOutput", "GraphBreak", "InternalErrorReport", "SkippedFrame", "explain"]


@dataclasses.dataclass
class GraphBreak:
    """One graph break: the reason in words and where it happened in the user's code."""

    reason: str
    filename: str | None = None
    lineno: int | None = None
    source_line: str | None = None
    #: the frame being captured (``code.co_qualname``)
    frame: str = ""
    #: False when the whole frame ran as plain Python instead of being split
    frame_captured: bool = True

    @property
    def location(self) -> str | None:
        if self.filename is None:
            return None
        return f"{self.filename}:{self.lineno}"

    def __str__(self) -> str:
        where = self.location or "<unknown location>"
        text = f"{self.reason} at {where}"
        if self.source_line:
            text += f" ({self.source_line})"
        return text


def _op_names(gm: torch.fx.GraphModule) -> list[str]:
    from .symbolic.output_graph import _op_name

    return [_op_name(n.op, n.target) for n in gm.graph.nodes
            if n.op in ("call_function", "call_method", "call_module")]


@dataclasses.dataclass
class SkippedFrame:
    """A frame the hook did not capture because of where its code lives, and why."""

    frame: str
    filename: str
    lineno: int
    reason: str

    def __str__(self) -> str:
        return f"{self.frame} ({self.filename}:{self.lineno}): {self.reason}"


@dataclasses.dataclass
class InternalErrorReport:
    """kiln failed while capturing a frame (a bug in kiln); the frame ran eagerly."""

    frame: str
    phase: str
    error: str

    def __str__(self) -> str:
        return f"{self.frame}: while {self.phase}: {self.error}"


@dataclasses.dataclass
class ExplainOutput:
    """What ``explain`` found.  ``print()`` it for a readable report."""

    graphs: list[torch.fx.GraphModule]
    graph_count: int
    graph_break_count: int
    break_reasons: list[GraphBreak]
    op_count: int
    ops_per_graph: list[list[str]]
    out_guards: list[Guard]
    #: seconds each captured frame took to convert (tracing + backend), in capture order
    compile_times: list[tuple[str, float]] = dataclasses.field(default_factory=list)
    #: frames not captured because of their file (torch's, the standard library...), in
    #: the order they were first met
    skipped_frames: list[SkippedFrame] = dataclasses.field(default_factory=list)
    #: kiln's own failures (not graph breaks): each frame listed here ran eagerly
    internal_errors: list[InternalErrorReport] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"Graph Count: {self.graph_count}",
                 f"Graph Break Count: {self.graph_break_count}",
                 f"Op Count: {self.op_count}"]
        if self.break_reasons:
            lines.append("Break Reasons:")
            for i, b in enumerate(self.break_reasons, 1):
                lines.append(f"  Break Reason {i}:")
                lines.append(f"    Reason: {b.reason}")
                where = b.location or "<unknown location>"
                frame = b.frame
                if frame.startswith("__resume_at_"):
                    frame += ", the code after an earlier graph break"
                lines.append(f"    Location: {where} (frame {frame})")
                if b.source_line:
                    lines.append(f"      {b.source_line}")
                if not b.frame_captured:
                    lines.append("    The frame was not captured; it runs as plain Python.")
        if self.internal_errors:
            lines.append("Internal Errors (bugs in kiln; these frames ran eagerly):")
            lines.extend(f"  {e}" for e in self.internal_errors)
            lines.append(f"  {BUG_REPORT_HINT}")
        if self.skipped_frames:
            lines.append("Skipped Frames:")
            lines.extend(f"  {f}" for f in self.skipped_frames)
        if self.ops_per_graph:
            lines.append("Ops per Graph:")
            for i, ops in enumerate(self.ops_per_graph, 1):
                lines.append(f"  Ops {i}:")
                lines.extend(f"    {op}" for op in ops)
        if self.out_guards:
            lines.append("Out Guards:")
            for i, g in enumerate(self.out_guards, 1):
                lines.append(f"  Guard {i}: {str(g).lstrip(' -')}")
        if self.compile_times:
            lines.append("Compile Times:")
            lines.extend(f"  {name}: {secs * 1e3:.1f} ms" for name, secs in self.compile_times)
        return "\n".join(lines)


def explain(fn: Callable[..., Any], *extra_args: Any,
            **extra_kwargs: Any) -> Callable[..., ExplainOutput]:
    """``explain(fn)(*args, **kwargs)`` runs ``fn(*args, **kwargs)`` once under kiln's frontend
    (after ``reset()``) and returns an ``ExplainOutput``.  ``extra_args``/``extra_kwargs`` are
    prepended to / merged with the call's."""
    from . import convert, eval_frame
    from .api import optimize, reset

    def inner(*args: Any, **kwargs: Any) -> ExplainOutput:
        reset()
        graphs: list[torch.fx.GraphModule] = []
        breaks: list[GraphBreak] = []
        guards: list[Guard] = []
        times: list[tuple[str, float]] = []
        skipped: list[SkippedFrame] = []
        internal: list[InternalErrorReport] = []

        def record_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
            graphs.append(gm)
            return gm.forward

        def observer(frame_info: Any, compiled: Any, reason: Any, seconds: float) -> None:
            code = frame_info.code
            times.append((code.co_qualname, seconds))
            if compiled is None:
                if isinstance(reason, InternalError):
                    internal.append(InternalErrorReport(
                        reason.frame, reason.phase,
                        f"{type(reason.inner).__name__}: {reason.inner}"))
                elif isinstance(reason, Unsupported):
                    breaks.append(GraphBreak(reason.reason, reason.filename, reason.lineno,
                                             reason.source_line, frame=code.co_qualname,
                                             frame_captured=False))
                elif reason is not None:
                    breaks.append(GraphBreak(str(reason), code.co_filename,
                                             code.co_firstlineno, frame=code.co_qualname,
                                             frame_captured=False))
                return
            for e in compiled.graph_breaks:
                breaks.append(GraphBreak(e.reason, e.filename, e.lineno, e.source_line,
                                         frame=code.co_qualname))
            guards.extend(compiled.check_fn.guards)

        def skip_observer(code: Any, reason: str) -> None:
            skipped.append(SkippedFrame(code.co_qualname, code.co_filename,
                                        code.co_firstlineno, reason))

        convert.observers.append(observer)
        eval_frame.skip_observers.append(skip_observer)
        try:
            optimize(record_backend)(fn)(*extra_args, *args, **{**extra_kwargs, **kwargs})
        finally:
            convert.observers.remove(observer)
            eval_frame.skip_observers.remove(skip_observer)
            reset()
        ops = [_op_names(gm) for gm in graphs]
        return ExplainOutput(graphs=graphs, graph_count=len(graphs),
                             graph_break_count=len(breaks), break_reasons=breaks,
                             op_count=sum(len(o) for o in ops), ops_per_graph=ops,
                             out_guards=guards, compile_times=times,
                             skipped_frames=skipped, internal_errors=internal)

    return inner

