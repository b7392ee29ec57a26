"""Higher-order operators (kiln_frontend.symbolic.hops): torch.cond and while_loop under
fullgraph=True are one graph whose bodies are subgraphs, closed-over tensors are lifted and
guarded, a constant predicate inlines the taken branch, an operator without an entry breaks
the graph naming itself."""

from __future__ import annotations

import operator

import pytest
import torch
from _counting_backend import CountingBackend
from kiln_frontend import compile as kiln_compile
from kiln_frontend.exc import Unsupported
from kiln_frontend.symbolic import hops
from kiln_frontend.symbolic.hops.map_scan import SCAN_YS_ALONG_DIM
from torch._higher_order_ops.map import map as hmap
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

pytestmark = pytest.mark.usefixtures("fresh_frontend")

W = torch.randn(4)


def cond_fn(x, y):
    def true_fn(a, b):
        return a.sin() + b * W

    def false_fn(a, b):
        return a.cos() * b

    return torch.cond(x.sum() > 0, true_fn, false_fn, (x, y)) + 1


def _cond_nodes(gm):
    return [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond]


def test_cond_with_a_tensor_predicate_is_one_graph_with_both_branches_as_subgraphs():
    backend = CountingBackend()
    compiled = kiln_compile(cond_fn, backend=backend, fullgraph=True)
    y = torch.randn(4)
    for x in (torch.rand(4) + 0.1, -torch.rand(4) - 0.1):  # each branch taken
        torch.testing.assert_close(compiled(x, y), cond_fn(x, y))
    assert len(backend.graphs) == 1
    gm = backend.graphs[0]
    (node,) = _cond_nodes(gm)
    true_gm = getattr(gm, node.args[1].target)
    false_gm = getattr(gm, node.args[2].target)
    assert isinstance(true_gm, torch.fx.GraphModule) and isinstance(false_gm, torch.fx.GraphModule)
    # the closed-over global W is lifted: one more operand, the same signature for both
    assert len(node.args[3]) == 3
    for branch in (true_gm, false_gm):
        assert len([n for n in branch.graph.nodes if n.op == "placeholder"]) == 3
    assert "sin" in true_gm.code and "cos" in false_gm.code


def test_cond_returning_a_tuple_keeps_its_structure():
    def f(x):
        return torch.cond(x[0] > 0, lambda a: (a + 1, a * 2), lambda a: (a - 1, a / 2), (x,))

    backend = CountingBackend()
    compiled = kiln_compile(f, backend=backend, fullgraph=True)
    for x in (torch.ones(3), -torch.ones(3)):
        out = compiled(x)
        assert isinstance(out, tuple) and len(out) == 2
        torch.testing.assert_close(out, f(x))
    assert len(backend.graphs) == 1


def test_a_closed_over_tensor_replaced_recompiles():
    box = {"w": torch.ones(4)}

    def f(x):
        w = box["w"]
        return torch.cond(x.sum() > 0, lambda a: a * w, lambda a: a - w, (x,))

    backend = CountingBackend()
    compiled = kiln_compile(f, backend=backend, fullgraph=True)
    x = torch.rand(4) + 0.1
    torch.testing.assert_close(compiled(x), f(x))
    box["w"] = torch.full((4,), 3.0)  # same metadata: read as a graph input, new value seen
    torch.testing.assert_close(compiled(x), f(x))
    box["w"] = torch.full((4, 1), 3.0, dtype=torch.float64)  # new metadata: recompiles
    torch.testing.assert_close(compiled(x), f(x))
    assert len(backend.graphs) == 2


def test_a_closed_over_python_value_is_guarded():
    state = {"scale": 2.0}

    def f(x):
        s = state["scale"]
        return torch.cond(x.sum() > 0, lambda a: a * s, lambda a: a + s, (x,))

    backend = CountingBackend()
    compiled = kiln_compile(f, backend=backend, fullgraph=True)
    x = torch.rand(4) + 0.1
    torch.testing.assert_close(compiled(x), f(x))
    state["scale"] = 5.0
    torch.testing.assert_close(compiled(x), f(x))  # 5.0, not the 2.0 baked into the subgraph
    assert len(backend.graphs) == 2


@pytest.mark.parametrize("pred", [True, False])
def test_a_constant_predicate_inlines_the_taken_branch_and_is_guarded(pred):
    def f(x, p):
        return torch.cond(p, lambda a: a.sin(), lambda a: a.cos(), (x,))

    backend = CountingBackend()
    compiled = kiln_compile(f, backend=backend, fullgraph=True)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x, pred), f(x, pred))
    torch.testing.assert_close(compiled(x, not pred), f(x, not pred))
    assert len(backend.graphs) == 2
    for gm in backend.graphs:
        assert not _cond_nodes(gm)


def test_a_size_predicate_inlines_the_branch_its_sizes_give():
    def f(x):
        return torch.cond(x.shape[0] > 4, lambda a: a.sin(), lambda a: a.cos(), (x,))

    backend = CountingBackend()
    compiled = kiln_compile(f, backend=backend, fullgraph=True, dynamic=False)
    for n in (8, 2):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x), f(x))
    assert len(backend.graphs) == 2


def test_while_loop_is_one_graph():
    k = torch.tensor(0.5)

    def f(i, x):
        return while_loop(lambda i, x: i < 5, lambda i, x: (i + 1, x * 2 + k), (i, x))

    backend = CountingBackend()
    compiled = kiln_compile(f, backend=backend, fullgraph=True)
    i, x = torch.tensor(0), torch.randn(3)
    torch.testing.assert_close(compiled(i, x), f(i, x))
    assert len(backend.graphs) == 1
    targets = backend.call_targets(0)
    assert torch.ops.higher_order.while_loop in targets


def test_map_is_one_graph_with_its_body_a_subgraph():
    k = torch.randn(3)

    def f(xs, b):
        return hmap(lambda pair, b: (pair[0] * b + k, pair[1].sum()), (xs, xs.cos()), b)

    backend = CountingBackend()
    compiled = kiln_compile(f, backend=backend, fullgraph=True)
    xs, b = torch.randn(4, 3), torch.randn(3)
    for a, e in zip(compiled(xs, b), f(xs, b), strict=True):
        torch.testing.assert_close(a, e)
    assert len(backend.graphs) == 1
    (node,) = [n for n in backend.graphs[0].graph.nodes
               if n.target is torch.ops.higher_order.map_impl]
    assert len(node.args[1]) == 2 and len(node.args[2]) == 2  # xs pytree flat; b and lifted k


def test_scan_is_one_graph_with_dim_and_reverse_around_it():
    def f(init, xs):
        def combine(c, x):
            n = c * 0.5 + x
            return n, (n.sum(), n * 2)

        return scan(combine, init, xs, dim=1, reverse=True)

    backend = CountingBackend()
    ys_along_dim = SCAN_YS_ALONG_DIM  # else kiln breaks the graph at the scan
    compiled = kiln_compile(f, backend=backend, fullgraph=ys_along_dim)
    init, xs = torch.randn(3), torch.randn(3, 5)
    (c, (s, d)), (ce, (se, de)) = compiled(init, xs), f(init, xs)
    for a, e in ((c, ce), (s, se), (d, de)):
        torch.testing.assert_close(a, e)
    if ys_along_dim:
        assert len(backend.graphs) == 1
        assert torch.ops.higher_order.scan in backend.call_targets(0)
    else:
        assert not any(torch.ops.higher_order.scan in backend.call_targets(i)
                       for i in range(len(backend.graphs)))


def test_scan_changing_its_carry_breaks_naming_it():
    def f(init, xs):
        return scan(lambda c, x: (c.sum(), c + x), init, xs)

    with pytest.raises(Unsupported, match="scan's combine_fn turns a carried"):
        kiln_compile(f, backend=CountingBackend(), fullgraph=True)(torch.randn(3),
                                                                   torch.randn(4, 3))


def test_a_branch_that_changes_python_state_breaks_naming_it():
    seen = []

    def f(x):
        def true_fn(a):
            seen.append(1)
            return a + 1

        return torch.cond(x.sum() > 0, true_fn, lambda a: a - 1, (x,))

    with pytest.raises(Unsupported, match="changes Python state"):
        kiln_compile(f, backend=CountingBackend(), fullgraph=True)(torch.randn(3))


def test_a_branch_writing_its_input_in_place_breaks():
    def f(x):
        return torch.cond(x.sum() > 0, lambda a: a.add_(1), lambda a: a - 1, (x,))

    with pytest.raises(Unsupported, match="in place"):
        kiln_compile(f, backend=CountingBackend(), fullgraph=True)(torch.randn(3))


def test_an_unknown_higher_order_operator_breaks_the_graph_naming_itself():
    from torch._higher_order_ops.wrap import wrap

    def f(x):
        return wrap(operator.mul, x.sin(), 2) + 1

    with pytest.raises(Unsupported, match=r"torch\.ops\.higher_order\.wrap"):
        kiln_compile(f, backend=CountingBackend(), fullgraph=True)(torch.randn(3))
    backend = CountingBackend()
    x = torch.randn(3)
    torch.testing.assert_close(kiln_compile(f, backend=backend)(x), f(x))  # runs, in two graphs
    assert len(backend.graphs) == 2


def test_the_registry_refuses_a_second_entry():
    entry = hops.registered()["torch.cond"]
    with pytest.raises(ValueError, match="registered twice"):
        hops.register(entry)
    with pytest.raises(ValueError, match="already belongs"):
        hops.register(hops.HigherOrderOp("other", (torch.ops.higher_order.cond,), entry.capture,
                                         "", "", ""))
