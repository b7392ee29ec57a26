"""The kernel plan (kiln_loopir.kernel_plan): golden text, loop collapsing, on-chip buffers,
signature; and the codegen registry (kiln_loopir.codegen_registry)."""

from __future__ import annotations

import textwrap

import kiln_loopir as K
import pytest
import torch
from helpers import aten_graph
from kiln_loopir import codegen_registry
from kiln_loopir.kernel_plan import plan_kernel


def plans(fn, *args, mode="real"):
    sched = K.schedule(K.lower(aten_graph(fn, *args, mode=mode), list(args)))
    return [plan_kernel(g, sched) for g in sched.groups]


def test_softmax_plan_golden():
    (plan,) = plans(lambda x: torch.softmax(x, -1), torch.randn(4, 10))
    assert str(plan) == textwrap.dedent("""\
        KernelPlan group0 (reduction)
          outer [4] -> loops [4] numel 4
          buf0: reduction inner [10] rnumel 10 max
            load arg0[r0 + 10*i0]
            store buf0[i0]
          buf1: reduction inner [10] rnumel 10 sum
            load arg0[r0 + 10*i0]
            load buf0[i0]
            store buf1[i0]
          buf2: pointwise inner [10] rnumel 10
            load arg0[r0 + 10*i0]
            load buf0[i0]
            load buf1[i0]
            store buf2[r0 + 10*i0]
          registers: buf0, buf1
          signature (buf2: float32 w, arg0: float32 r)""")
    assert plan.kind == "reduction" and plan.reduction_types == ["max", "sum"]


def test_contiguous_pointwise_collapses_to_one_loop():
    (plan,) = plans(lambda x: x.sin() + x.cos(), torch.randn(4, 10, 3))
    assert plan.kind == "pointwise"
    assert [str(r) for r in plan.loop_ranges] == ["120"]
    assert [str(d.index) for d in plan.nodes[0].writes] == ["i0"]


def test_transpose_keeps_two_loops():
    (plan,) = plans(lambda x: x.t().contiguous() * 2, torch.randn(6, 5))
    assert len(plan.loop_ranges) == 2  # a 2-D tile: no single loop keeps both accesses affine
    assert plan.signature.names() == ["buf0", "arg0"]


def test_dynamic_plan_signature_has_size_symbols():
    (plan,) = plans(lambda x: x.sin().cos(), torch.randn(4, 6), mode="symbolic")
    assert [a.name for a in plan.signature.sizes] == ["s0", "s1"]
    assert "s0" in str(plan.numel) and "s1" in str(plan.numel)


def test_registry_refuses_duplicates_and_lists_known_names(monkeypatch):
    monkeypatch.setattr(codegen_registry, "_registered", {})
    entry = codegen_registry.CodegenEntry("toy", ("toydev",), RuntimeError, lambda options: "built")
    codegen_registry.register_codegen(entry)
    with pytest.raises(ValueError, match="already registered"):
        codegen_registry.register_codegen(entry)
    assert codegen_registry.get_codegen("toy").build(None) == "built"
    assert codegen_registry.codegen_for_device_type("toydev") is entry
    assert RuntimeError in codegen_registry.compile_errors()
    with pytest.raises(ValueError, match="unknown codegen 'fortran'; known codegens: .*toy"):
        codegen_registry.get_codegen("fortran")
