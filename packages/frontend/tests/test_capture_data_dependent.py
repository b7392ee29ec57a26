"""Values read out of tensors with ``fullgraph=True`` (issue 10): ``t.item()``,
``float(t)``, ``int(t)`` and boolean-mask indexing ``x[x > 0]`` are captured with unbacked
symbols (``zuf0``, ``u0``) computed by the graph, as torch.compile captures them.  Nothing
about the values is guarded (no input holds them), so a new call with other data reuses the
graph and gets its own answer; a branch on such a value is a graph break."""

from __future__ import annotations

import pytest
import torch
from _counting_backend import CountingBackend, check_calls
from kiln_frontend import compile as kiln_compile
from kiln_frontend import reset
from kiln_frontend.exc import Unsupported

pytestmark = pytest.mark.usefixtures("fresh_frontend")


def _unbacked(gm) -> set[str]:
    out = set()
    for node in gm.graph.nodes:
        ex = node.meta.get("example_value")
        if isinstance(ex, (torch.SymInt, torch.SymFloat)):
            out |= {str(s) for s in ex.node.expr.free_symbols}
        if isinstance(ex, torch.Tensor):
            for d in ex.shape:
                if isinstance(d, torch.SymInt):
                    out |= {str(s) for s in d.node.expr.free_symbols}
    return out


def test_item_is_an_unbacked_float_in_one_graph():
    def f(x):
        return x * x.sum().item()

    (gm,) = check_calls(f, (torch.randn(5),), (torch.randn(5),))
    assert any(n.op == "call_method" and n.target == "item" for n in gm.graph.nodes)
    assert any(s.startswith("zuf") for s in _unbacked(gm)), gm.graph


def test_float_and_int_of_a_tensor():
    def f(x, n):
        # float of a float tensor, int of an int and of a float tensor, of a constant tensor
        return x + float(x.max()) + int(n.sum()) + int(x.sum() * 3) + float(torch.tensor(2))

    check_calls(f, (torch.randn(4), torch.tensor([1, 2])), (torch.randn(4), torch.tensor([3, 4])))


def test_item_returned_to_python():
    def f(x):
        return x.sum().item(), x * 2

    check_calls(f, (torch.ones(3),), (torch.zeros(3),))


def test_boolean_mask_has_an_unbacked_size():
    def f(x):
        y = x[x > 0]
        return y * 2, y.shape[0] + torch.zeros(y.shape[0])

    (gm,) = check_calls(f, (torch.tensor([1.0, -1.0, 2.0]),), (torch.tensor([-1.0, -2.0, 3.0]),),
                   (torch.tensor([-1.0, -2.0, -3.0]),))
    assert any(s.startswith("u") for s in _unbacked(gm)), gm.graph


def test_branch_on_an_item_is_a_graph_break_and_correct():
    def f(x):
        if x.sum().item() > 0:
            return x + 1
        return x - 1

    with pytest.raises(Unsupported, match="data-dependent"):
        kiln_compile(f, backend=CountingBackend(), fullgraph=True)(torch.ones(2))
    reset()
    check_calls(f, (torch.ones(2),), (-torch.ones(2),), graphs=3, fullgraph=False)
