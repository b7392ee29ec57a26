"""The loop IR's verifier: the invariants the stages after lowering and scheduling rely on
(the wrapper allocates, the codegens load and store, the interpreter runs in step order).

Each rule is a function in a table (``GRAPH_RULES``, ``SCHEDULE_RULES``) under a name; a broken
rule raises ``IRVerifyError`` naming the rule, the buffer or step, and what is wrong.
``verify_graph`` runs at the end of lowering (every rule) and ``verify_schedule`` at the end
of ``schedule`` (``Schedule.lint()`` too): there always the rules that only walk the
structures; with ``KILN_VERIFY_IR=1`` (the loopir tests set it) also the rules marked
``traces``, which run every node's body again, and the graph's rules once more.

This module sits above ``values`` and ``graph``; it reads a schedule by its attributes
(a step's ``kind`` picks its rules), so ``schedule`` can call it without an import cycle.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from ..analysis import body_deps
from ..sizevars import reduction_symbol
from .graph import LoopGraph, collect_deps
from .values import (
    Buffer,
    ComputedBuffer,
    ConstantBuffer,
    ExternKernel,
    InputBuffer,
    Layout,
    MultiOutput,
    Reduction,
    ReinterpretView,
    ScatterBuffer,
)

__all__ = ["IRVerifyError", "verify_graph", "verify_schedule", "verify_enabled", "GRAPH_RULES",
           "SCHEDULE_RULES"]


class IRVerifyError(AssertionError):
    """A broken invariant of a LoopGraph or Schedule. ``rule``: the rule's name in
    ``GRAPH_RULES``/``SCHEDULE_RULES`` (``memory/<part>``: a part of the ``memory`` rule);
    ``where``: the buffer or step it was found at."""

    def __init__(self, rule: str, where: str, message: str):
        self.rule = rule
        self.where = where
        super().__init__(f"{where}: {message} (IR rule {rule!r})")


def verify_enabled() -> bool:
    """``KILN_VERIFY_IR=1``: verify the whole graph (bodies traced) at the end of scheduling."""
    return os.environ.get("KILN_VERIFY_IR", "") not in ("", "0")


@dataclass(frozen=True)
class Rule:
    """One invariant: ``check(graph or schedule)`` raises IRVerifyError when it is broken."""

    name: str
    check: Callable
    traces: bool  # runs loop bodies


GRAPH_RULES: dict[str, Rule] = {}
SCHEDULE_RULES: dict[str, Rule] = {}


def _rule(table: dict[str, Rule], name: str, traces: bool = False):
    def register(fn):
        if name in table:
            raise ValueError(f"IR rule {name!r} is registered twice")
        table[name] = Rule(name, fn, traces)
        return fn
    return register


def verify_graph(graph: LoopGraph, *, trace_bodies: bool = True) -> None:
    """Check every graph rule (``trace_bodies=False``: those that do not run bodies)."""
    for rule in GRAPH_RULES.values():
        if trace_bodies or not rule.traces:
            rule.check(graph)


def verify_schedule(schedule, *, trace_bodies: bool = False) -> None:
    """Check the schedule rules on ``schedule`` (a ``kiln_loopir.ir.Schedule``); those that
    run the nodes' bodies only with ``trace_bodies``."""
    for rule in SCHEDULE_RULES.values():
        if trace_bodies or not rule.traces:
            rule.check(schedule)


# ============================================================================================
# graph rules
# ============================================================================================


def _layouts(graph: LoopGraph):
    """(where, layout) of every layout the graph holds."""
    for b in [*graph.inputs, *graph.constant_buffers, *graph.buffers]:
        if b.layout is not None:
            yield b.name, b.layout
    for k, o in enumerate(graph.outputs):
        if isinstance(o, ReinterpretView):
            yield f"output {k} ({o.data.name})", o.layout


def _check_rank(rule: str, where: str, layout: Layout) -> None:
    if len(layout.size) != len(layout.stride):
        raise IRVerifyError(rule, where, f"layout has {len(layout.size)} sizes and "
                            f"{len(layout.stride)} strides")


@_rule(GRAPH_RULES, "layout-rank")
def _layout_rank(graph: LoopGraph) -> None:
    """Each layout has as many strides as sizes (indexing zips them)."""
    for where, layout in _layouts(graph):
        _check_rank("layout-rank", where, layout)


@_rule(GRAPH_RULES, "unique-names")
def _unique_names(graph: LoopGraph) -> None:
    """No name is defined twice among inputs, constants and buffers, and ``name_to_buffer``
    maps each to its own buffer (the wrapper binds buffers by name)."""
    seen: set[str] = set()
    for b in [*graph.inputs, *graph.constant_buffers, *graph.buffers]:
        if b.name in seen:
            raise IRVerifyError("unique-names", b.name, "is defined twice")
        seen.add(b.name)
        if graph.name_to_buffer.get(b.name) is not b:
            raise IRVerifyError("unique-names", b.name, "is not the buffer name_to_buffer "
                                "maps its name to")


@_rule(GRAPH_RULES, "inputs")
def _inputs(graph: LoopGraph) -> None:
    """Each input is an InputBuffer of its own placeholder position (the wrapper and the
    interpreter bind ``args[position]`` to it); when ``input_positions`` is filled in (lowering
    does; a hand-built graph may leave it empty), it maps that position back to the input."""
    taken: set[int] = set()
    pos = graph.input_positions
    for k, b in enumerate(graph.inputs):
        if not isinstance(b, InputBuffer):
            raise IRVerifyError("inputs", b.name, f"is a {type(b).__name__} among the inputs")
        if b.position < 0 or b.position in taken:
            raise IRVerifyError("inputs", b.name, f"has position {b.position}, negative or "
                                "another input's")
        taken.add(b.position)
        if pos and (b.position >= len(pos) or pos[b.position] != k):
            raise IRVerifyError("inputs", b.name, f"is input {k} but input_positions does not "
                                f"map placeholder {b.position} to it")


@_rule(GRAPH_RULES, "constants")
def _constants(graph: LoopGraph) -> None:
    """Each ConstantBuffer's value is what ``constants`` binds its name to, and nothing else is
    bound there (the wrapper's constants are ``graph.constants``)."""
    names = set()
    for b in graph.constant_buffers:
        if not isinstance(b, ConstantBuffer) or graph.constants.get(b.name) is not b.value:
            raise IRVerifyError("constants", b.name, "is not bound to its value in constants")
        names.add(b.name)
    for name in graph.constants:
        if name not in names:
            raise IRVerifyError("constants", name, "is bound in constants but has no ConstantBuffer")


@_rule(GRAPH_RULES, "loop-rank")
def _loop_rank(graph: LoopGraph) -> None:
    """A loop nest has one range per dim of the buffer it writes (its store indexes the layout
    with the loop's index); a ScatterBuffer's ranges are its updates', so it is exempt."""
    for b in graph.buffers:
        if isinstance(b, ComputedBuffer) and not isinstance(b, ScatterBuffer):
            if len(b.data.ranges) != len(b.layout.size):
                raise IRVerifyError("loop-rank", b.name, f"loops over {len(b.data.ranges)} "
                                    f"dims but its layout has {len(b.layout.size)}")


def _defined_walk(graph: LoopGraph, visit: Callable[[Buffer, set[str]], None]) -> set[str]:
    """Call ``visit(buffer, names defined before it)`` for each buffer in order."""
    seen = {b.name for b in graph.inputs} | set(graph.constants)
    for b in graph.buffers:
        visit(b, seen)
        seen.add(b.name)
    return seen


def _extern_reads(b: Buffer, seen: set[str]) -> None:
    if isinstance(b, ExternKernel):
        for n in b.input_buffers():
            if n not in seen:
                raise IRVerifyError("defined-before-use", b.name, f"reads {n} before it is defined")
    elif isinstance(b, MultiOutput):
        if b.source.name not in seen:
            raise IRVerifyError("defined-before-use", b.name,
                                f"selects from {b.source.name} before it is defined")
    elif isinstance(b, ScatterBuffer) and b.target.name not in seen:
        raise IRVerifyError("defined-before-use", b.name,
                            f"writes into {b.target.name} before it is defined")


@_rule(GRAPH_RULES, "defined-before-use")
def _defined_before_use(graph: LoopGraph) -> None:
    """Extern calls read, MultiOutputs select from and ScatterBuffers write into buffers
    defined earlier (inputs, constants, earlier buffers): ``buffers`` is in topological
    order. Loop bodies' loads: ``body-reads``."""
    _defined_walk(graph, _extern_reads)


def _body_deps(b: Buffer, seen: set[str]) -> None:
    if not isinstance(b, ComputedBuffer):
        return
    reads, writes = collect_deps(b)
    for d in reads:
        if d.name not in seen:
            raise IRVerifyError("body-reads", b.name, f"loads {d.name} before it is defined")
    own = b.target.name if isinstance(b, ScatterBuffer) else b.name
    for d in writes:
        if d.name != own:
            raise IRVerifyError("body-reads", b.name, f"stores into {d.name}, not {own}")


@_rule(GRAPH_RULES, "body-reads", traces=True)
def _body_reads(graph: LoopGraph) -> None:
    """A loop body loads only buffers defined before its own and stores only its own buffer
    (a ScatterBuffer: its target)."""
    _defined_walk(graph, _body_deps)


@_rule(GRAPH_RULES, "multi-outputs")
def _multi_outputs(graph: LoopGraph) -> None:
    """A MultiOutput selects from an ExternKernel that lists it among its ``outputs`` (the
    extern step binds exactly those)."""
    for b in graph.buffers:
        if isinstance(b, MultiOutput):
            src = b.source
            if not isinstance(src, ExternKernel) or not any(m is b for m in src.outputs):
                raise IRVerifyError("multi-outputs", b.name, f"is not among the outputs of "
                                    f"its source {src.name}")


@_rule(GRAPH_RULES, "outputs-defined")
def _outputs_defined(graph: LoopGraph) -> None:
    """Each graph output that is a tensor views a buffer of the graph."""
    for k, o in enumerate(graph.outputs):
        if isinstance(o, ReinterpretView) and graph.name_to_buffer.get(o.data.name) is not o.data:
            raise IRVerifyError("outputs-defined", f"output {k}",
                                f"views {o.data.name}, which the graph does not define")


# ============================================================================================
# schedule rules
# ============================================================================================


def _group_defines(step) -> list[str]:
    # a ScatterBuffer's own name is a step name; what it writes is its target's
    return [n.buffer.name for n in step.nodes]


def _extern_defines(step) -> list[str]:
    return list(step.writes)


#: step kind -> the names a step of that kind defines
_STEP_DEFINES: dict[str, Callable] = {"group": _group_defines, "extern": _extern_defines}


def _defines(step) -> list[str]:
    try:
        return _STEP_DEFINES[step.kind](step)
    except KeyError:
        raise IRVerifyError("step-kinds", step.name, f"has unknown step kind {step.kind!r}") from None


@_rule(SCHEDULE_RULES, "step-kinds")
def _step_kinds(schedule) -> None:
    """Every step is a FusedGroup or an ExternNode, under a name no other step has, and a
    node's kind is its buffer's (a reduction node writes a Reduction)."""
    names: set[str] = set()
    for step in schedule.steps:
        _defines(step)
        if step.name in names:
            raise IRVerifyError("step-kinds", step.name, "is the name of two steps")
        names.add(step.name)
        for n in getattr(step, "nodes", ()):
            want = "reduction" if isinstance(n.buffer.data, Reduction) else "pointwise"
            if n.kind != want:
                raise IRVerifyError("step-kinds", f"{step.name}/{n.name}",
                                    f"is a {n.kind} node but its buffer is {want}")


@_rule(SCHEDULE_RULES, "defined-once")
def _defined_once(schedule) -> None:
    """No buffer is defined by two steps, nor by a step and as an input or constant, and each
    step defines buffers of its graph."""
    g = schedule.graph
    seen = {b.name for b in g.inputs} | set(g.constants)
    for step in schedule.steps:
        for nm in _defines(step):
            if nm in seen:
                raise IRVerifyError("defined-once", step.name, f"defines {nm}, defined before")
            if nm not in g.name_to_buffer:
                raise IRVerifyError("defined-once", step.name, f"defines {nm}, which is not a "
                                    "buffer of the graph")
            seen.add(nm)


def _check_alloc(step, a, g, st) -> None:
    _check_rank("memory/allocations", f"{step.name}/alloc {a.name}", a.layout)
    if a.name not in g.name_to_buffer:
        raise IRVerifyError("memory/allocations", step.name, f"allocates {a.name}, which is not a "
                            "buffer of the graph")
    if a.name in st.allocated:
        raise IRVerifyError("memory/allocations", step.name, f"{a.name} allocated twice")
    if a.in_place:
        if a.reuses in st.freed or a.reuses not in step.frees or a.reuses in st.keep:
            raise IRVerifyError("memory/allocations", step.name, f"{a.name} reuses {a.reuses} in "
                                f"place, which does not die at {step.name}")
    elif a.reuses is not None and (a.reuses not in st.freed or a.reuses in st.lent):
        raise IRVerifyError("memory/allocations", step.name, f"{a.name} reuses {a.reuses}, which is "
                            "not free")
    if a.reuses is not None:
        st.freed.discard(a.reuses)
        st.lent.add(a.reuses)
    st.allocated.add(a.name)


def _run_group(step, st) -> None:
    written: set[str] = set()
    for n in step.nodes:
        for d in n.reads:
            if d.name not in st.ready and d.name not in written:
                raise IRVerifyError("memory/reads-ready", f"{step.name}/{n.name}",
                                    f"reads {d.name} before it is written")
            if d.name in st.dead:
                raise IRVerifyError("memory/reads-ready", f"{step.name}/{n.name}", f"reads freed {d.name}")
        for d in n.writes:
            if d.name in st.dead:
                raise IRVerifyError("memory/reads-ready", f"{step.name}/{n.name}", f"writes freed {d.name}")
            if d.name not in st.allocated and d.name not in st.ready:
                raise IRVerifyError("memory/allocations", step.name,
                                    f"{d.name} is written but never allocated")
            written.add(d.name)
    st.ready |= written


def _run_extern(step, st) -> None:
    for nm in step.reads:
        if nm not in st.ready:
            raise IRVerifyError("memory/reads-ready", step.name, f"reads {nm} before it is written")
        if nm in st.dead:
            raise IRVerifyError("memory/reads-ready", step.name, f"reads freed {nm}")
    st.ready |= set(step.writes)


#: step kind -> how the memory walk runs a step of that kind
_STEP_RUN: dict[str, Callable] = {"group": _run_group, "extern": _run_extern}


@dataclass
class _MemoryState:
    keep: set[str]  # inputs, constants, outputs: never freed
    ready: set[str]  # written (or bound) so far
    freed: set[str]  # dead, their storage free to take
    dead: set[str]  # freed after some step: never used again
    lent: set[str]  # freed buffers whose storage a later allocation took
    allocated: set[str]


def _walk(schedule) -> _MemoryState:
    g = schedule.graph
    ready = {b.name for b in g.inputs} | set(g.constants)
    st = _MemoryState(ready | set(g.output_names()), set(ready), set(), set(), set(), set())
    for step in schedule.steps:
        for a in step.allocations:
            _check_alloc(step, a, g, st)
        _STEP_RUN[step.kind](step, st)
        for nm in step.frees:
            if nm in st.keep:
                raise IRVerifyError("memory/frees", step.name,
                                    f"{nm} is an input, constant or output but is freed")
            if nm not in st.ready:
                raise IRVerifyError("memory/frees", step.name, f"frees {nm}, which is not written yet")
            if nm in st.dead:
                raise IRVerifyError("memory/frees", step.name, f"frees {nm} twice")
            st.freed.add(nm)
            st.dead.add(nm)
    return st


@_rule(SCHEDULE_RULES, "memory")
def _memory(schedule) -> None:
    """Walk the steps in order with the memory plan: each step reads buffers written by
    earlier steps (or earlier in its group), inputs or constants (``reads-ready``);
    allocations name graph buffers of equal-rank layouts, happen once, and reuse only freed
    storage (in place: a buffer dying at this very step) (``allocations``); nothing is used
    after it is freed; inputs, constants and outputs are never freed, nothing twice
    (``frees``); every output is produced (``outputs-produced``). Its errors name the part
    broken: ``memory/<part>``."""
    st = _walk(schedule)
    for k, o in enumerate(schedule.graph.outputs):
        if isinstance(o, ReinterpretView) and o.data.name not in st.ready:
            raise IRVerifyError("memory/outputs-produced", f"output {k}",
                                f"views {o.data.name}, which no step writes")


@_rule(SCHEDULE_RULES, "group-deps")
def _group_deps(schedule) -> None:
    """A FusedGroup's ``writes`` are its nodes' stores in order, and its ``reads`` the loads of
    buffers not written earlier in the group, first occurrence each (a kernel's signature and
    the memory plan are made from them)."""
    for step in schedule.steps:
        if step.kind != "group":
            continue
        reads, writes, written = [], [], set()
        for n in step.nodes:
            for d in n.reads:
                if d.name not in written and d not in reads:
                    reads.append(d)
            writes += n.writes
            written |= {d.name for d in n.writes}
        if list(step.reads) != reads or list(step.writes) != writes:
            raise IRVerifyError("group-deps", step.name, "reads/writes are not its nodes' "
                                f"(reads {[str(d) for d in step.reads]}, nodes' "
                                f"{[str(d) for d in reads]})")


@_rule(SCHEDULE_RULES, "node-deps", traces=True)
def _node_deps(schedule) -> None:
    """A SchedNode's recorded ``reads``/``writes`` are what its body loads and stores over
    the group's ``i*`` and its own ``r*`` (codegens read the recorded ones)."""
    for step in schedule.steps:
        if step.kind != "group":
            continue
        for n in step.nodes:
            h = body_deps(n.body, step.outer_symbols, [reduction_symbol(k) for k in range(len(n.inner))])
            if h.reads != list(n.reads) or h.writes != list(n.writes):
                raise IRVerifyError("node-deps", f"{step.name}/{n.name}",
                                    f"body loads {[str(d) for d in h.reads]} and stores "
                                    f"{[str(d) for d in h.writes]}, but reads "
                                    f"{[str(d) for d in n.reads]} and writes "
                                    f"{[str(d) for d in n.writes]} are recorded")
