"""A compiled graph returns eager's strides also where they leave gaps (a slice of a wider
result). A training graph depends on it: its backward is traced with eager's strides for the
tensors the forward saves. On CUDA, where an ``addmm`` runs as ``mm`` plus a fused bias
epilogue, a GRU's gate chunks came out of the forward contiguous while the backward read them
with the [N, 3H] row stride: wrong gradients (and out-of-bounds reads) on an H200."""

from __future__ import annotations

import copy

import kiln
import kiln_frontend
import pytest
import torch
from kiln_loopir.lowerings import extern
from torch import nn


def _slices(x):
    y = torch.sigmoid(x) * 2
    return y[:, 6:12], y.t()[3:5]


def test_outputs_keep_eagers_strides_with_gaps(needs_cpp):
    kiln_frontend.reset()
    x = torch.randn(4, 18)
    got, want = kiln.compile(_slices)(x), _slices(x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
        assert g.stride() == w.stride()


class _GRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(8, 6, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(12, 3)

    def forward(self, x):
        return self.head(torch.relu(self.rnn(x)[0]))


@pytest.fixture
def cuda_matmul_policy(monkeypatch):
    """CPU lowers matmuls as CUDA does (``addmm`` -> ``mm`` + a fused bias epilogue)."""
    cuda = extern.DEVICE_LIBRARIES["cuda"]
    policy = cuda.__class__(**{**cuda.__dict__, "available": lambda: True})
    monkeypatch.setitem(extern.DEVICE_LIBRARIES, "cpu", policy)


@pytest.mark.parametrize("backend", ["kiln", "loopir_interpret"])
def test_gru_training_with_cudas_matmul_lowering(backend, cuda_matmul_policy, needs_cpp):
    kiln_frontend.reset()
    torch.manual_seed(0)
    compiled_model = _GRU().train()
    eager_model = copy.deepcopy(compiled_model)
    x = torch.randn(2, 5, 8)
    loss = kiln.compile(compiled_model, backend=backend)(x).square().mean()
    loss.backward()
    expected = eager_model(x).square().mean()
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    for p, q in zip(compiled_model.parameters(), eager_model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
