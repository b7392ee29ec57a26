"""Nodes run for their effect (a check that raises) survive dead-code elimination and the
partitioner, whatever FX's ``Node.is_impure`` says on this torch release: torch 2.11's drops
``aten._linalg_check_errors`` (it returns nothing), and ``torch.linalg.inv`` of a singular
matrix then returned garbage instead of raising."""

from __future__ import annotations

import pytest
import torch
import torch.fx
from kiln_aotgrad import compile_joint, trace_inference

SINGULAR = torch.zeros(4, 4)
INVERTIBLE = torch.eye(4) * 2 + 0.1


class Inverse(torch.nn.Module):
    def forward(self, m):
        return torch.linalg.inv(m) * 2


@pytest.fixture(params=["this torch", "torch 2.11's is_impure"])
def fx_purity(request, monkeypatch):
    """FX's purity as this torch answers it, and as older releases did: only placeholders,
    outputs and a short list of asserts impure."""
    if request.param != "this torch":
        def older_is_impure(node, impure_random=True):
            return node.op in ("placeholder", "output") or node.target in (
                torch._assert, torch.ops.aten._assert_async.msg)

        monkeypatch.setattr(torch.fx.Node, "is_impure", older_is_impure)
    return request.param


def _check_ops(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes
            if n.target is torch.ops.aten._linalg_check_errors.default]


def test_inference_graph_keeps_a_check_that_returns_nothing(fx_purity):
    gm = torch.fx.symbolic_trace(Inverse())
    aten_gm = trace_inference(gm, [INVERTIBLE])
    assert len(_check_ops(aten_gm)) == 1, aten_gm.code
    torch.testing.assert_close(aten_gm(INVERTIBLE)[0], Inverse()(INVERTIBLE))
    with pytest.raises(torch.linalg.LinAlgError):
        aten_gm(SINGULAR)


def test_forward_graph_keeps_a_check_that_returns_nothing(fx_purity):
    graphs = []

    def keep(gm):
        graphs.append(gm)
        return gm

    compiled = compile_joint(torch.fx.symbolic_trace(Inverse()),
                             [INVERTIBLE.clone().requires_grad_()], keep, keep)
    x, y = INVERTIBLE.clone().requires_grad_(), INVERTIBLE.clone().requires_grad_()
    compiled(x).sum().backward()
    Inverse()(y).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)
    forward, backward = graphs
    assert len(_check_ops(forward)) == 1 and not _check_ops(backward), forward.code
    with pytest.raises(torch.linalg.LinAlgError):
        compiled(SINGULAR.clone().requires_grad_())
