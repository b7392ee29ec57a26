"""A tensor built inside the traced code (``torch.tensor(x.size(-1))``, as transformers'
DeBERTa-v2 scales its attention) in a training graph: the joint trace's second pass met the
first pass's real ``_tensor_constant`` and the fake mode refused it ("Please convert all
Tensors to FakeTensors first"), so the whole frame ran eagerly (benchmarks/model_sweep.py)."""

from __future__ import annotations

import copy
import operator

import torch
import torch.fx
import torch.nn as nn
from kiln_aotgrad import compile_joint


class ScaledByConstant(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x) / torch.sqrt(torch.tensor(8, dtype=torch.float) * 2)


def _captured(model: nn.Module) -> torch.fx.GraphModule:
    """``model``'s graph as the frontend hands it over: ``torch.tensor`` a call in the graph
    (``symbolic_trace`` would run it at trace time and keep its value as an attribute)."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    t = g.call_function(torch.tensor, (8,), {"dtype": torch.float})
    scale = g.call_function(torch.sqrt, (g.call_function(operator.mul, (t, 2)),))
    g.output(g.call_function(operator.truediv, (g.call_module("lin", (x,)), scale)))
    return torch.fx.GraphModule(model, g)


def test_tensor_constant_in_a_training_graph():
    torch.manual_seed(0)
    model = ScaledByConstant()
    ref = copy.deepcopy(model)
    x = torch.randn(2, 8)
    compiled = compile_joint(_captured(model), [x])
    loss = compiled(x).square().mean()
    loss.backward()
    ref_loss = ref(x).square().mean()
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
