"""The loop IR's verifier (kiln_loopir.ir.verify): each rule raises IRVerifyError naming the
rule and the buffer or step on a graph or schedule broken in exactly that way, and the
pipeline runs it (after lowering; at the end of scheduling, the body-tracing rules with
KILN_VERIFY_IR=1)."""

from __future__ import annotations

import copy
import dataclasses

import kiln_loopir as K
import pytest
import torch
from helpers import aten_graph
from kiln_loopir.ir import (
    Buffer,
    ComputedBuffer,
    ExternKernel,
    FusedGroup,
    IRVerifyError,
    Layout,
    MultiOutput,
    ReinterpretView,
    verify_graph,
    verify_schedule,
)
from kiln_loopir.ir import verify as V

_CONST = torch.randn(4, 6)


def _f(x, w):
    a = x.relu() @ w  # buf0 (pointwise) feeds buf1 (extern mm)
    b = (x.sin() + _CONST).cos().sum(1)  # a reduction reading a constant
    v, i = torch.sort(x, 1)  # a multi-output extern
    return a * 2, b, v + 1, i


def _graph():
    x, w = torch.randn(4, 6), torch.randn(6, 5)
    return K.lower(aten_graph(_f, x, w), [x, w])


@pytest.fixture
def graph():
    return _graph()


@pytest.fixture
def sched():
    return K.schedule(_graph())


def _raises(rule: str, where: str, fn, *args, **kw):
    with pytest.raises(IRVerifyError) as e:
        fn(*args, **kw)
    assert e.value.rule == rule and e.value.where == where, str(e.value)
    assert where in str(e.value) and rule in str(e.value)


def _buf(graph, cls, k=0) -> Buffer:
    return [b for b in graph.buffers if type(b) is cls][k]


def _group(sched, k=0) -> FusedGroup:
    return sched.groups[k]


def test_a_lowered_graph_and_its_schedule_verify(graph):
    verify_graph(graph)
    s = K.schedule(graph)
    verify_schedule(s, trace_bodies=True)
    s.lint()


# ---- graph rules ---------------------------------------------------------------------------


def test_layout_rank(graph):
    b = _buf(graph, ComputedBuffer)
    bad = copy.copy(b.layout)
    object.__setattr__(bad, "stride", bad.stride[:-1])  # Layout() itself refuses this
    b.layout = bad
    _raises("layout-rank", b.name, verify_graph, graph)


def test_unique_names(graph):
    b = _buf(graph, ComputedBuffer)
    graph.buffers.append(b)
    _raises("unique-names", b.name, verify_graph, graph)


def test_name_to_buffer_maps_to_the_buffer(graph):
    b = _buf(graph, ComputedBuffer)
    graph.name_to_buffer[b.name] = _buf(graph, ComputedBuffer, 1)
    _raises("unique-names", b.name, verify_graph, graph)


def test_inputs_at_their_positions(graph):
    graph.input_positions.reverse()
    _raises("inputs", "arg0", verify_graph, graph)


def test_inputs_positions_distinct(graph):
    graph.input_positions.clear()  # a hand-built graph's
    verify_graph(graph)
    graph.inputs[1].position = 0
    _raises("inputs", "arg1", verify_graph, graph)


def test_constants_bound(graph):
    (c,) = graph.constant_buffers
    graph.constants[c.name] = c.value.clone()
    _raises("constants", c.name, verify_graph, graph)


def test_loop_rank(graph):
    b = _buf(graph, ComputedBuffer)
    b.data.ranges = b.data.ranges[:-1]
    _raises("loop-rank", b.name, verify_graph, graph)


def test_extern_reads_defined_before_use(graph):
    mm = _buf(graph, ExternKernel)  # reads buf0, the relu
    graph.buffers.remove(mm)
    graph.buffers.insert(0, mm)
    _raises("defined-before-use", mm.name, verify_graph, graph)


def test_multi_output_selects_from_a_defined_extern(graph):
    m = _buf(graph, MultiOutput)
    graph.buffers.remove(m)
    graph.buffers.insert(0, m)
    _raises("defined-before-use", m.name, verify_graph, graph)


def test_body_reads_defined_before_use(graph):
    add = graph.buffers[-1]  # v + 1 reads the sort's first MultiOutput
    graph.buffers.remove(add)
    graph.buffers.insert(0, add)
    _raises("body-reads", add.name, verify_graph, graph)
    verify_graph(graph, trace_bodies=False)  # the one rule that runs bodies


def test_body_stores_its_own_buffer(graph):
    a, other = _buf(graph, ComputedBuffer, 0), _buf(graph, ComputedBuffer, 1)
    # a's body now stores into another buffer
    a.store_body = ComputedBuffer(other.name, a.layout, a.data).store_body
    _raises("body-reads", a.name, verify_graph, graph)


def test_multi_outputs_listed_by_their_source(graph):
    m = _buf(graph, MultiOutput)
    m.source.outputs.remove(m)
    _raises("multi-outputs", m.name, verify_graph, graph)


def test_outputs_defined(graph):
    ghost = Buffer("ghost", Layout.contiguous("cpu", torch.float32, [4, 5]))
    graph.outputs[0] = ReinterpretView(ghost, ghost.layout)
    _raises("outputs-defined", "output 0", verify_graph, graph)


def test_lowering_verifies_the_graph(monkeypatch):
    def refuse(graph):
        raise IRVerifyError("test", "graph", "refused")

    monkeypatch.setitem(V.GRAPH_RULES, "test", V.Rule("test", refuse, False))
    with pytest.raises(IRVerifyError, match="refused"):
        _graph()


# ---- schedule rules ------------------------------------------------------------------------


def test_step_names_unique(sched):
    g0, g1 = _group(sched, 0), _group(sched, 1)
    g1.name = g0.name
    _raises("step-kinds", g0.name, verify_schedule, sched)


def test_node_kind_is_its_buffers(sched):
    g = _group(sched, 0)
    n = g.nodes[0]
    n.kind = "reduction"
    _raises("step-kinds", f"{g.name}/{n.name}", verify_schedule, sched)


def test_unknown_step_kind(sched):
    g = _group(sched, 0)
    g.kind = "loop"  # the instance's, not FusedGroup's
    _raises("step-kinds", g.name, verify_schedule, sched)


def test_defined_once(sched):
    g = _group(sched, 1)
    sched.steps.append(dataclasses.replace(g, name="again", allocations=[], frees=[]))
    _raises("defined-once", "again", verify_schedule, sched)


def test_reads_ready(sched):
    mm = sched.externs[0]  # reads buf0, written by group0
    sched.steps.remove(mm)
    sched.steps.insert(0, mm)
    _raises("memory/reads-ready", mm.name, verify_schedule, sched)


def test_reads_after_free(sched):
    mm = sched.externs[0]
    sched.steps[0].frees.append("buf0")  # freed before the mm reads it
    _raises("memory/reads-ready", mm.name, verify_schedule, sched)


def test_allocations_name_graph_buffers(sched):
    g = _group(sched, 0)
    a = g.allocations[0]
    g.allocations[0] = dataclasses.replace(a, name="ghost")
    _raises("memory/allocations", g.name, verify_schedule, sched)


def test_allocation_layout_rank(sched):
    g = _group(sched, 0)
    a = g.allocations[0]
    bad = copy.copy(a.layout)
    object.__setattr__(bad, "size", bad.size[:-1])
    g.allocations[0] = dataclasses.replace(a, layout=bad)
    _raises("memory/allocations", f"{g.name}/alloc {a.name}", verify_schedule, sched)


def test_allocated_once(sched):
    g = _group(sched, 0)
    g.allocations.append(g.allocations[0])
    _raises("memory/allocations", g.name, verify_schedule, sched)


def test_reuse_only_freed_storage(sched):
    g = _group(sched, 0)
    g.allocations[0] = dataclasses.replace(g.allocations[0], reuses="arg1")
    with pytest.raises(IRVerifyError, match="which is not free"):
        verify_schedule(sched)


def test_written_buffers_are_allocated(sched):
    g = _group(sched, 0)
    g.allocations.pop(0)
    _raises("memory/allocations", g.name, verify_schedule, sched)


def test_kept_buffers_never_freed(sched):
    last = sched.steps[-1]
    last.frees.append("arg0")
    _raises("memory/frees", last.name, verify_schedule, sched)


def test_freed_once(sched):
    mm = sched.externs[0]  # frees buf0
    sched.steps[-1].frees.append("buf0")
    assert "buf0" in mm.frees
    _raises("memory/frees", sched.steps[-1].name, verify_schedule, sched)


def test_outputs_produced(sched):
    last = sched.steps.pop()  # writes the output buf7
    assert "buf7" in last.output_names()
    _raises("memory/outputs-produced", "output 2", verify_schedule, sched)


def test_group_deps(sched):
    g = _group(sched, 0)
    g.reads.pop()
    _raises("group-deps", g.name, verify_schedule, sched)


def test_node_deps_traced_only_when_asked(sched):
    g = _group(sched, 0)
    n = g.nodes[1]
    n.reads = [d for d in n.reads if d.name != "const0"]
    g.reads = [d for d in g.reads if d.name != "const0"]
    verify_schedule(sched)  # the recorded deps agree with each other
    _raises("node-deps", f"{g.name}/{n.name}", verify_schedule, sched, trace_bodies=True)


def test_schedule_lint_is_the_verifier(sched):
    sched.steps.reverse()
    with pytest.raises(IRVerifyError):
        sched.lint()


@pytest.mark.parametrize("env, traced", [("1", True), ("0", False)])
def test_scheduling_runs_the_traced_rules_under_kiln_verify_ir(monkeypatch, env, traced):
    ran = []
    monkeypatch.setitem(V.SCHEDULE_RULES, "test", V.Rule("test", ran.append, True))
    monkeypatch.setenv("KILN_VERIFY_IR", env)
    s = K.schedule(_graph())
    assert (ran == [s]) is traced


def test_rules_registered_once():
    with pytest.raises(ValueError, match="registered twice"):
        V._rule(V.GRAPH_RULES, "layout-rank")(lambda g: None)
