"""``KILN_LOGS=perf``: time per generated kernel and per extern call of each compiled graph,
against eager's ATen ops on the same inputs, so the report says which kernels lose.

How: ``profiled(compiled, aten_gm)`` re-runs the wrapper's source with a timer around every
kernel launch and extern call (an AST rewrite of ``call``: ``t = clock()`` before the line,
``record(step, clock() - t)`` after it), in a copy of the wrapper's namespace, so the kernels
and constants are the ones already loaded. When a call comes, the ATen graph also runs eagerly
node by node (``torch.fx.Interpreter``, each node timed) on the same inputs. The backend calls
``profiled`` only when the channel is on: with ``KILN_LOGS`` unset nothing is rewritten and no
call pays anything.

Kernels are matched to eager ops by **segment**: an extern call (``aten.convolution``,
``aten.mm``...) runs the same ATen op as eager, so the k-th extern with an op matches the k-th
eager node with that op; the generated kernels between two matched externs do the work of
the eager nodes between them. A row per segment compares kiln's kernels with eager's ops there
(``LOSES`` when kiln is more than 10% slower), and a row per extern compares it with the same
eager op (a different layout, e.g. channels-last, can make the same op slower).

The report (``report()``) prints to stderr at exit; ``profiles()`` returns the per-graph data
(``GraphProfile``) and ``reset()`` clears it.
"""

from __future__ import annotations

import ast
import atexit
import dataclasses
import itertools
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .logs import log_enabled

__all__ = ["GraphProfile", "StepTimes", "instrument_source", "profiled", "profiles", "report",
           "reset", "PERF_CHANNEL"]

PERF_CHANNEL = "perf"
#: kiln time over eager time above which a segment or extern is marked ``LOSES``
LOSS_MARGIN = 1.10
_RECORD = "__kiln_perf_record"
_CLOCK = "__kiln_perf_clock"
_T0 = "__kiln_perf_t0"


@dataclasses.dataclass
class StepTimes:
    """One timed line of a wrapper: a kernel launch or an extern call."""

    index: int
    kind: str  # "kernel" | "extern"
    name: str  # kernel name (cpp_kernel_3) or the extern's result (buf7)
    op: str  # kernel name again, or the extern's op text (aten.convolution.default)
    segment: int  # externs and kernels between two matched externs share a segment number
    samples: list[float] = dataclasses.field(default_factory=list, repr=False)  # s per call

    @property
    def calls(self) -> int:
        return len(self.samples)

    @property
    def seconds(self) -> float:
        return sum(self.samples)

    @property
    def ms_per_call(self) -> float:
        """Median over calls: one preemption on a loaded machine does not move it."""
        return 1e3 * statistics.median(self.samples) if self.samples else 0.0


@dataclasses.dataclass
class GraphProfile:
    """Times of one compiled graph over its profiled calls (per-call samples; reports use
    medians)."""

    name: str
    steps: list[StepTimes]
    call_s: list[float] = dataclasses.field(default_factory=list)  # whole wrapper calls
    eager_call_s: list[float] = dataclasses.field(default_factory=list)
    eager_node_s: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # node -> s
    eager_node_op: dict[str, str] = dataclasses.field(default_factory=dict)  # fx node -> op
    extern_match: dict[int, str] = dataclasses.field(default_factory=dict)  # step -> fx node
    eager_segment: dict[str, int] = dataclasses.field(default_factory=dict)  # fx node -> seg

    @property
    def calls(self) -> int:
        return len(self.call_s)

    @property
    def eager_calls(self) -> int:
        return len(self.eager_call_s)

    @property
    def kiln_ms(self) -> float:
        """Median ms of a whole call (kernels, externs, allocations, Python)."""
        return 1e3 * statistics.median(self.call_s) if self.call_s else 0.0

    @property
    def eager_ms(self) -> float | None:
        return 1e3 * statistics.median(self.eager_call_s) if self.eager_calls else None

    def eager_node_ms(self, node: str | None) -> float | None:
        """Median ms of eager node ``node`` per call (None without an eager run)."""
        if not node or not self.eager_calls:
            return None
        times = self.eager_node_s.get(node)
        return 1e3 * statistics.median(times) if times else 0.0

    def op_of(self, node: str) -> str:
        """The ATen op of eager node ``node`` (``aten.mm.default``)."""
        return self.eager_node_op[node]

    def segments(self) -> list[dict[str, Any]]:
        """Per segment: kiln kernel ms, eager ms of the non-extern ops there, their names."""
        out = []
        segs = sorted({s.segment for s in self.steps if s.kind == "kernel"}
                      | set(self.eager_segment.values()))
        for seg in segs:
            kernels = [s for s in self.steps if s.kind == "kernel" and s.segment == seg]
            nodes = [n for n, g in self.eager_segment.items() if g == seg]
            kiln_ms = sum(s.ms_per_call for s in kernels)
            eager_ms = (sum(self.eager_node_ms(n) for n in nodes) if self.eager_calls else None)
            ops = Counter(_short(self.eager_node_op[n]) for n in nodes)
            out.append({"segment": seg, "kernels": [s.name for s in kernels], "kiln_ms": kiln_ms,
                        "eager_ms": eager_ms, "eager_ops": dict(ops)})
        return out

    def text(self) -> str:
        kiln_ms = self.kiln_ms
        steps_ms = sum(s.ms_per_call for s in self.steps)
        head = (f"kiln perf: graph {self.name}: {self.calls} calls, {kiln_ms:.3f} ms/call "
                f"({steps_ms:.3f} in {sum(s.kind == 'kernel' for s in self.steps)} kernels and "
                f"{sum(s.kind == 'extern' for s in self.steps)} externs, "
                f"{kiln_ms - steps_ms:.3f} wrapper)")
        if self.eager_calls:
            eager_ms = self.eager_ms
            head += f"; eager ATen ops {eager_ms:.3f} ms/call ({_ratio(kiln_ms, eager_ms)})"
        lines = [head, f"  {'segment / step':<28} {'kiln ms':>9} {'eager ms':>9} {'kiln/eager':>10}"
                       "  what"]
        by_seg = {d["segment"]: d for d in self.segments()}
        for s in self.steps:
            if s.kind == "extern":
                node = self.extern_match.get(s.index)
                e_ms = self.eager_node_ms(node)
                lines.append(_row(f"  {s.name} (extern)", s.ms_per_call, e_ms, _short(s.op)))
            seg = by_seg.pop(s.segment, None) if s.kind == "kernel" else None
            if seg is not None:
                ops = ", ".join(f"{k}x{v}" if v > 1 else k for k, v in seg["eager_ops"].items())
                lines.append(_row(f"  segment {seg['segment']}: {len(seg['kernels'])} kernels",
                                  seg["kiln_ms"], seg["eager_ms"], ops or "-"))
                if len(seg["kernels"]) > 1:
                    for k in (x for x in self.steps if x.kind == "kernel" and x.segment == seg["segment"]):
                        lines.append(f"    {k.name:<26} {k.ms_per_call:9.3f}")
        for seg in by_seg.values():  # eager ops with no kiln kernel in their segment
            if seg["eager_ms"]:
                ops = ", ".join(seg["eager_ops"])
                lines.append(_row(f"  segment {seg['segment']}: 0 kernels", 0.0, seg["eager_ms"], ops))
        return "\n".join(lines)

    __str__ = text

    def losers(self) -> list[tuple[str, float]]:
        """(what, ms lost per call) for segments and externs slower than eager, worst first."""
        out = []
        for seg in self.segments():
            if seg["eager_ms"] is not None and seg["kiln_ms"] > LOSS_MARGIN * seg["eager_ms"]:
                out.append((f"{self.name} segment {seg['segment']} ({', '.join(seg['kernels'])})",
                            seg["kiln_ms"] - seg["eager_ms"]))
        for s in self.steps:
            node = self.extern_match.get(s.index)
            if s.kind == "extern" and node and self.eager_calls:
                e_ms = self.eager_node_ms(node)
                if s.ms_per_call > LOSS_MARGIN * e_ms:
                    out.append((f"{self.name} {s.name} {_short(s.op)}", s.ms_per_call - e_ms))
        return sorted(out, key=lambda x: -x[1])


def _short(op: str) -> str:
    if op.startswith("<built-in function "):  # operator.getitem
        return op.removeprefix("<built-in function ").removesuffix(">")
    return op.removeprefix("aten.").removesuffix(".default")


def _ratio(kiln_ms: float, eager_ms: float | None) -> str:
    if not eager_ms:
        return "-"
    return f"{kiln_ms / eager_ms:.2f}x"


def _row(label: str, kiln_ms: float, eager_ms: float | None, what: str) -> str:
    e = f"{eager_ms:9.3f}" if eager_ms is not None else f"{'-':>9}"
    loses = eager_ms is not None and kiln_ms > LOSS_MARGIN * eager_ms and kiln_ms - eager_ms > 1e-3
    return (f"{label:<30} {kiln_ms:9.3f} {e} {_ratio(kiln_ms, eager_ms):>10}  "
            f"{'LOSES ' if loses else ''}{what}")


# ------------------------------------------------------------------------ instrumenting


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _classify(stmt: ast.stmt, kernel_names: set[str]) -> tuple[str, str, str] | None:
    """("kernel", name, name) for ``cpp_kernel_3(...)``; ("extern", result, op text) for
    ``buf7 = aten.convolution.default(...)``; None for any other line."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        f = stmt.value.func
        if isinstance(f, ast.Name) and f.id in kernel_names:
            return "kernel", f.id, f.id
    if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name) and isinstance(stmt.value, ast.Call)
            and _root_name(stmt.value.func) in ("aten", "torch")):
        return "extern", stmt.targets[0].id, ast.unparse(stmt.value.func)
    return None


def instrument_source(source: str, kernel_names: Sequence[str],
                      entry: str = "call") -> tuple[str, list[StepTimes]]:
    """The wrapper source with a timer around each kernel launch and extern call in ``entry``
    (they call ``__kiln_perf_record(step, seconds)``), and the steps it times, in order."""
    tree = ast.parse(source)
    names = set(kernel_names)
    steps: list[StepTimes] = []
    for fn in tree.body:
        if not (isinstance(fn, ast.FunctionDef) and fn.name == entry):
            continue
        body: list[ast.stmt] = []
        for stmt in fn.body:
            what = _classify(stmt, names)
            if what is None:
                body.append(stmt)
                continue
            kind, name, op = what
            i = len(steps)
            steps.append(StepTimes(i, kind, name, op, segment=0))
            body += ast.parse(f"{_T0} = {_CLOCK}()").body
            body.append(stmt)
            body += ast.parse(f"{_RECORD}({i}, {_CLOCK}() - {_T0})").body
        fn.body = body
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n", steps


# ------------------------------------------------------------------------ eager side


class _TimedInterpreter(torch.fx.Interpreter):
    """Runs an ATen graph eagerly, adding each call_function node's seconds to ``times``."""

    def __init__(self, gm, times: dict[str, float], sync: Callable[[], None] | None):
        super().__init__(gm, garbage_collect_values=True)
        self.times = times
        self.sync = sync

    def run_node(self, n):
        if n.op != "call_function":
            return super().run_node(n)
        if self.sync:
            self.sync()
        t0 = time.perf_counter()
        out = super().run_node(n)
        if self.sync:
            self.sync()
        self.times.setdefault(n.name, []).append(time.perf_counter() - t0)
        return out


def _match_segments(prof: GraphProfile, aten_gm) -> None:
    """Match the k-th extern of an op to the k-th eager node with that op; number segments
    so that kernels and eager nodes between two matched externs share one."""
    nodes = [n for n in aten_gm.graph.nodes if n.op == "call_function"]
    prof.eager_node_op = {n.name: str(n.target) for n in nodes}
    by_op: dict[str, list[int]] = {}
    for pos, n in enumerate(nodes):
        by_op.setdefault(str(n.target), []).append(pos)
    used: Counter[str] = Counter()
    matched_pos: dict[int, int] = {}  # extern step -> eager position
    last = -1
    for s in prof.steps:
        if s.kind != "extern":
            continue
        cands = [p for p in by_op.get(s.op, []) if p > last]
        if cands:  # in order: a match never goes back before the previous one
            matched_pos[s.index] = cands[0]
            last = cands[0]
            used[s.op] += 1
    seg = 0
    for s in prof.steps:
        if s.index in matched_pos:
            seg += 1
            s.segment = seg
            prof.extern_match[s.index] = nodes[matched_pos[s.index]].name
            seg += 1
        else:
            s.segment = seg
    boundaries = sorted(matched_pos.values())
    for pos, n in enumerate(nodes):
        k = sum(1 for b in boundaries if b < pos)  # matched externs before this node
        if pos in boundaries:
            continue
        prof.eager_segment[n.name] = 2 * k


# ------------------------------------------------------------------------ the profiled graph

_lock = threading.Lock()
_profiles: list[GraphProfile] = []
_graph_ids = itertools.count()
_atexit_registered = False


class ProfiledGraph:
    """A compiled graph whose calls are timed per step (and compared with eager's ops)."""

    def __init__(self, compiled, call: Callable, prof: GraphProfile, aten_gm,
                 sync: Callable[[], None] | None):
        self.compiled = compiled
        self.call = call
        self.profile = prof
        self.aten_gm = aten_gm
        self.sync = sync
        self.seen = 0
        for attr in ("source", "filename", "module"):
            setattr(self, attr, getattr(compiled, attr, None))

    def __call__(self, *inputs):
        prof = self.profile
        self.seen += 1
        if self.seen == 1:  # the first call warms caches and allocators: not counted
            return self.compiled(*inputs)
        if self.aten_gm is not None:
            args = [x.clone() if isinstance(x, torch.Tensor) and _mutates_inputs(self.aten_gm)
                    else x for x in inputs]
            t0 = time.perf_counter()
            try:
                _TimedInterpreter(self.aten_gm, prof.eager_node_s, self.sync).run(*args)
            except Exception:  # an eager comparison must never break the compiled call
                self.aten_gm = None
            else:
                prof.eager_call_s.append(time.perf_counter() - t0)
        if self.sync:
            self.sync()
        t0 = time.perf_counter()
        out = self.call(list(inputs))
        if self.sync:
            self.sync()
        prof.call_s.append(time.perf_counter() - t0)
        return out

    def __repr__(self) -> str:
        return f"<ProfiledGraph {self.profile.name}>"


def _mutates_inputs(gm) -> bool:
    cached = getattr(gm, "_kiln_perf_mutates", None)
    if cached is None:
        cached = any(n.op == "call_function" and getattr(n.target, "_schema", None) is not None
                     and n.target._schema.is_mutable for n in gm.graph.nodes)
        gm._kiln_perf_mutates = cached
    return cached


def profiled(compiled, aten_gm=None, *, enabled: bool | None = None):
    """``compiled`` (a ``kiln_runtime.CompiledGraph``) with every kernel launch and extern call
    timed, when ``KILN_LOGS`` has ``perf`` (or ``enabled=True``); otherwise ``compiled``
    itself. ``aten_gm``: the ATen graph it implements, run eagerly beside it for comparison."""
    if not (log_enabled(PERF_CHANNEL) if enabled is None else enabled):
        return compiled
    call = getattr(compiled, "call", None)
    module = getattr(compiled, "module", None)
    source = getattr(compiled, "source", None)
    if call is None or source is None or not hasattr(call, "__globals__"):
        return compiled  # not a generated wrapper (e.g. the interpreter fallback)
    kernel_names = [k.name for k in getattr(module, "kernels", None) or ()]
    entry = getattr(module, "entry", None) or "call"
    new_source, steps = instrument_source(source, kernel_names, entry)
    name = f"graph{next(_graph_ids)}"
    prof = GraphProfile(name=name, steps=steps)
    if aten_gm is not None:
        _match_segments(prof, aten_gm)

    def record(i: int, seconds: float) -> None:
        steps[i].samples.append(seconds)

    sync = getattr(module, "synchronize", None)  # the codegen's device wait (CUDA's queue)
    namespace = dict(call.__globals__)
    namespace[_RECORD] = record
    namespace[_CLOCK] = (lambda: (sync(), time.perf_counter())[1]) if sync else time.perf_counter
    filename = f"{getattr(compiled, 'filename', '<kiln-wrapper>')[:-1]}-perf>"
    exec(compile(new_source, filename, "exec"), namespace)
    global _atexit_registered
    with _lock:
        _profiles.append(prof)
        if not _atexit_registered:
            atexit.register(_print_report)
            _atexit_registered = True
    return ProfiledGraph(compiled, namespace[entry], prof, aten_gm, sync)


def profiles() -> list[GraphProfile]:
    """Every graph profiled in this process (since ``reset()``)."""
    with _lock:
        return list(_profiles)


def reset() -> None:
    with _lock:
        _profiles.clear()


def report(top: int = 15) -> str:
    """Per graph: each extern and each segment of kernels against eager's ops; then the
    steps that lose most time to eager, across graphs."""
    profs = [p for p in profiles() if p.calls]
    if not profs:
        return "kiln perf: no profiled calls"
    parts = [p.text() for p in profs]
    losers = sorted((x for p in profs for x in p.losers()), key=lambda x: -x[1])
    if losers:
        parts.append(f"kiln perf: where kiln loses to eager (ms per call, worst {top}):")
        parts += [f"  {ms:8.3f}  {what}" for what, ms in losers[:top]]
    kiln_ms = sum(p.kiln_ms for p in profs)
    eager = [p for p in profs if p.eager_calls]
    if eager:
        eager_ms = sum(p.eager_ms for p in eager)
        parts.append(f"kiln perf: all graphs {kiln_ms:.3f} ms per call; eager ATen ops "
                     f"{eager_ms:.3f} ms")
    return "\n".join(parts)


def _print_report() -> None:
    if any(p.calls for p in profiles()):
        print(report(), file=sys.stderr)
