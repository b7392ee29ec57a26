"""LSTM, GRU and RNN layers through kiln.compile on CPU (benchmarks/model_sweep.py found timm's
sequencer2d failing: ``nn.LSTM`` decomposes to ``aten.mkldnn_rnn_layer``, which had neither a
lowering nor a declared aten fallback, so the whole frame ran eagerly; it is a declared
fallback now). On CUDA the C++ composite took cuDNN's path, whose weight flattening no graph can
hold (sequencer2d ran eagerly on an H200): ``torch._VF.lstm``/``gru``/``rnn_*`` now trace as
torch's own decompositions on every device (``kiln_aotgrad.decompositions._recurrent_rule``),
so GRU and RNN compile on CPU too)."""

from __future__ import annotations

import warnings

import kiln
import kiln_frontend
import pytest
import torch
import torch.nn as nn
from kiln_frontend.logging_utils import KilnWarning


class Recurrent(nn.Module):
    def __init__(self, cell: type[nn.Module]):
        super().__init__()
        self.rnn = cell(8, 6, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(12, 3)

    def forward(self, x):
        return self.head(torch.relu(self.rnn(x)[0]))


def _run_twice(cell, device: str, input_grad: bool = True):
    """kiln.compile against eager, inference then training (loss, input and parameter grads;
    with ``input_grad=False`` the input needs none, only the weights do: torch's LSTM
    decomposition then picked oneDNN's inference-only layer and the backward crashed)."""
    kiln_frontend.reset()
    torch.manual_seed(0)
    model = Recurrent(cell).to(device).eval()
    x = torch.randn(2, 5, 8, device=device)
    before = kiln.stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)  # no "compile failed; it runs eagerly"
        with torch.no_grad():
            torch.testing.assert_close(kiln.compile(model)(x), model(x), rtol=1e-4, atol=1e-4)
        after = kiln.stats()
        assert after.graphs_compiled > before.graphs_compiled
        assert after.eager_fallbacks == before.eager_fallbacks

        kiln_frontend.reset()
        model.train()
        xs = [x.clone().requires_grad_(input_grad) for _ in range(2)]
        losses, grads = [], []
        for fn, xg in ((kiln.compile(model), xs[0]), (model, xs[1])):
            model.zero_grad()
            loss = fn(xg).square().mean()
            loss.backward()
            losses.append(loss.detach())
            grads.append([xg.grad] + [p.grad.clone() for p in model.parameters()])
        if not input_grad:
            assert grads[0][0] is None and grads[1][0] is None
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-4)
        assert kiln.stats().training_graphs > after.training_graphs


@pytest.mark.parametrize("cell, input_grad", [(nn.LSTM, True), (nn.LSTM, False), (nn.GRU, True),
                                              (nn.RNN, True)])  # (only LSTM has a oneDNN layer)
def test_recurrent_layer_compiles_and_matches_eager(cell, input_grad, needs_cpp):
    _run_twice(cell, "cpu", input_grad)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU, nn.RNN])
def test_recurrent_layer_compiles_on_cuda(cell, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # float32 on both sides
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    _run_twice(cell, "cuda")
