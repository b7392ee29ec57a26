"""An output of a compiled training graph that is a view of one of its buffers
(``lin(x).view(...)``) can be modified in place by the caller, as in eager: autograd forbade
it before ("Output 0 of CompiledFunction is a view and is being modified inplace"), which
benchmarks/model_sweep.py hit in transformers' Falcon between two graphs."""

from __future__ import annotations

import copy

import torch
import torch.fx
import torch.nn as nn
from kiln_aotgrad import compile_joint


class ViewOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x).view(2, 2, 4)


def test_view_output_modified_in_place_matches_eager():
    torch.manual_seed(0)
    model = ViewOut()
    ref = copy.deepcopy(model)
    x = torch.randn(2, 8)
    compiled = compile_joint(torch.fx.symbolic_trace(model), [x])
    out = compiled(x)
    out.mul_(2)
    out.square().sum().backward()
    want = ref(x)
    want.mul_(2)
    want.square().sum().backward()
    torch.testing.assert_close(out, want)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
