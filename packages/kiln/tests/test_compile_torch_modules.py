"""kiln.compile of a module whose forward torch itself defines (nn.Sequential,
nn.TransformerEncoderLayer, nn.MultiheadAttention) compiles one graph through the real kiln
backend: the root frame is captured even though its code is in torch's files."""

from __future__ import annotations

import kiln
import pytest
import torch
from torch import nn


def _self_attention():
    x = torch.randn(2, 3, 8)
    return (x, x, x)


CASES = {
    "sequential": (lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)),
                   lambda: (torch.randn(3, 8),)),
    "transformer_encoder_layer": (
        lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
        lambda: (torch.randn(2, 3, 8),)),
    "multihead_attention": (lambda: nn.MultiheadAttention(8, 2, batch_first=True),
                            _self_attention),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compile_torch_module_with_kiln(name, needs_cpp):
    import kiln_frontend as frontend

    frontend.reset()
    make_module, make_inputs = CASES[name]
    torch.manual_seed(0)
    module = make_module().eval()
    args = make_inputs()
    compiled = kiln.compile(module)
    before = kiln.stats().graphs_compiled
    with torch.no_grad():
        expected = module(*args)
        torch.testing.assert_close(compiled(*args), expected)
        torch.testing.assert_close(compiled(*args), expected)  # cached
    assert kiln.stats().graphs_compiled == before + 1
