"""Scheduler decisions that make kernels fast: fusion through reshapes, identical reductions
computed once, and a memory plan that never lends storage a kernel may not have."""

from __future__ import annotations

import kiln_loopir as K
import pytest
import torch
import torch.nn.functional as F
from helpers import aten_graph, check


def _layer_norm_then_flatten(x):
    # a transformer's pre-norm: the normalized rows feed a matmul as a 2-d view
    return F.layer_norm(x, (x.shape[-1],)).reshape(-1, x.shape[-1]) * 2.0


def test_layernorm_and_its_flattened_output_fuse():
    """The statistics run over outer [2, 32], the normalize step over [64, 16] (a view of the
    same rows): one group whose outer loop is [2, 32]."""
    x = torch.randn(2, 32, 16)
    sched, _ = check(_layer_norm_then_flatten, x, atol=1e-5)
    assert len(sched.groups) == 1, str(sched)
    (g,) = sched.groups
    assert [str(o) for o in g.outer] == ["2", "32"]
    assert [n.kind for n in g.nodes] == ["reduction", "reduction", "pointwise"]
    assert [str(r) for r in g.nodes[-1].inner] == ["16"]


def test_layernorm_and_its_flattened_output_fuse_dynamic():
    x = torch.randn(3, 5, 16)
    graph = K.lower(aten_graph(_layer_norm_then_flatten, x, mode="symbolic"))
    assert graph.sizevars, "traced with symbolic sizes"
    sched = K.schedule(graph)
    assert len(sched.groups) == 1, str(sched)
    for shape in [(3, 5, 16), (2, 7, 4)]:
        a = torch.randn(shape)
        torch.testing.assert_close(K.interpret(sched)(a)[0], _layer_norm_then_flatten(a), atol=1e-5, rtol=1e-5)


def test_a_coarser_group_is_refined_for_a_finer_node():
    """A pointwise group over [64, 16] meets a reduction over [4, 16] reducing [16] (the same
    rows seen as [4, 16, 16]): the group's outer [64] is refined to [4, 16]."""
    def f(x):
        y = (x * 3).sin()  # over [64, 16]: an output, so its own buffer
        return y, y.reshape(4, 16, 16).sum(-1)

    x = torch.randn(64, 16)
    sched, _ = check(f, x, atol=1e-5)
    assert len(sched.groups) == 1, str(sched)


def test_a_finer_reduction_refines_a_pointwise_group():
    """A realized pointwise buffer over [64, 16] read as [4, 16, 16] by two reductions over the
    last dim: the group becomes outer [4, 16], the producer an internal node with inner [16]."""
    def f(a, b, c, d, e):
        y = a * b + c * d + e.sin()  # five loads, two users: realized
        return y.reshape(4, 16, 16).sum(-1), y.reshape(4, 16, 16).amax(-1)

    sched, _ = check(f, *[torch.randn(64, 16) for _ in range(5)], atol=1e-5)
    assert len(sched.groups) == 1, str(sched)
    (g,) = sched.groups
    assert [str(o) for o in g.outer] == ["4", "16"]
    assert g.nodes[0].buffer.name in g.internal_buffers


def test_reshape_that_splits_a_reduced_dim_does_not_fuse():
    """[2, 4, 16] normalized over 16, then seen as [32, 4]: the view splits the reduced dim,
    so the normalize step cannot run per (i0, i1) point; the result stays correct."""
    def f(x):
        return F.layer_norm(x, (16,)).reshape(32, 4) * 2

    sched, _ = check(f, torch.randn(2, 4, 16), atol=1e-5)
    assert len(sched.groups) == 2


def test_identical_reductions_are_computed_once():
    def f(x):
        return x.sum(1) * x.mean(1) + x.sum(1).exp()

    sched, _ = check(f, torch.randn(8, 16), atol=1e-5)
    reductions = [n for g in sched.groups for n in g.nodes if n.kind == "reduction"]
    assert len(reductions) == 1, str(sched)


def test_different_reductions_are_kept():
    def f(x):
        return x.sum(1) + x.amax(1) + x[:, :8].sum(1) + (x * 2).sum(1)

    sched, _ = check(f, torch.randn(8, 16), atol=1e-5)
    reductions = [n for g in sched.groups for n in g.nodes if n.kind == "reduction"]
    assert len(reductions) == 4, str(sched)


def test_a_duplicate_reduction_that_is_an_output_is_kept():
    def f(x):
        return x.sum(1), x.sum(1) * 2

    sched, graph = check(f, torch.randn(8, 16), atol=1e-5)
    names = {n.buffer.name for g in sched.groups for n in g.nodes}
    for o in graph.output_names():
        assert o in names


@pytest.mark.parametrize("shape", [(64, 16), (3, 40, 16)])
def test_no_allocation_reuses_or_lends_internal_storage(shape):
    """Internal buffers may live in registers: the memory plan never hands their storage on
    and never gives them another buffer's storage."""
    def f(x):
        h = torch.softmax(x, -1) @ torch.ones(16, 16)
        return torch.softmax(h, -1).sum(-1)

    sched, _ = check(f, torch.randn(shape), atol=1e-5)
    internal = {nm for g in sched.groups for nm in g.internal_buffers}
    assert internal
    for step in sched.steps:
        for a in step.allocations:
            assert a.reuses not in internal, str(sched)
            assert not (a.internal and a.reuses), str(sched)


def _gelu_positions_then_norm_and_residual(x, pos):
    # Whisper's encoder entry: GELU of the convolution, transposed, plus positions; that value
    # feeds LayerNorm (its statistics and output passes) and the residual add
    h = F.gelu(x).transpose(1, 2) + pos
    return F.layer_norm(h.contiguous(), (h.shape[-1],)) + h


def test_a_costly_value_read_by_several_consumers_is_computed_once():
    """The GELU (erf) is realized once instead of inlined into every pass of the norm and into
    the residual add (four erf per element before)."""
    sched, _ = check(_gelu_positions_then_norm_and_residual, torch.randn(2, 16, 8),
                     torch.randn(8, 16), atol=1e-5)
    assert str(sched).count("ops.erf(") == 1, str(sched)
