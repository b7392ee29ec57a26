"""Parameters that are views into one shared buffer (a storage offset of their own), as cuDNN
leaves an RNN's weights after ``flatten_parameters``, or a model whose weights live in one flat
buffer. loopir had counted a constant's storage offset twice (once in its layout, once by the
binding's ``data_ptr``/``reinterpret_tensor``): every such model computed wrong numbers."""

from __future__ import annotations

import kiln
import kiln_frontend
import pytest
import torch
from torch import nn


def _flat_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 10), nn.Tanh(), nn.Linear(10, 4))
    flat = torch.randn(300)
    with torch.no_grad():
        start = 7
        for p in model.parameters():  # each a view at its own offset, with gaps between
            p.data = flat[start:start + p.numel()].view_as(p)
            start += p.numel() + 3
    assert all(p.storage_offset() > 0 for p in model.parameters())
    return model


@pytest.mark.parametrize("backend", ["kiln", "loopir_interpret"])
def test_parameters_inside_a_shared_buffer_compute_right(backend, needs_cpp):
    kiln_frontend.reset()
    model = _flat_model().eval()
    x = torch.randn(3, 10)
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(model, backend=backend)(x), model(x))


def test_training_with_parameters_and_an_input_inside_shared_buffers(needs_cpp):
    kiln_frontend.reset()
    compiled_model, eager_model = _flat_model(), _flat_model()
    x = torch.randn(40, 10)[5:8]  # an input with a storage offset as well
    loss = kiln.compile(compiled_model)(x).square().mean()
    loss.backward()
    expected = eager_model(x).square().mean()
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for p, q in zip(compiled_model.parameters(), eager_model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
