"""LSTM, GRU and RNN layers through kiln.compile on CPU (benchmarks/model_sweep.py found timm's
sequencer2d failing: ``nn.LSTM`` decomposes to ``aten.mkldnn_rnn_layer``, which had neither a
lowering nor a declared aten fallback, so the whole frame ran eagerly; it is a declared
fallback now)."""

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


# GRU and RNN: torch's decompositions of them write an intermediate in place (``add_``) after
# functionalization, so loopir declines the graph and the kiln backend runs it eagerly (one
# logged eager fallback): right, not compiled. Only the answer is checked for them.
@pytest.mark.parametrize("cell, compiles", [(nn.LSTM, True), (nn.GRU, False), (nn.RNN, False)])
def test_recurrent_layer_compiles_and_matches_eager(cell, compiles, needs_cpp):
    kiln_frontend.reset()
    torch.manual_seed(0)
    model = Recurrent(cell).eval()
    x = torch.randn(2, 5, 8)
    before = kiln.stats()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)  # no "compile failed; it runs eagerly"
        torch.testing.assert_close(kiln.compile(model)(x), model(x), rtol=1e-4, atol=1e-4)
    after = kiln.stats()
    if compiles:
        assert after.graphs_compiled > before.graphs_compiled
        assert after.eager_fallbacks == before.eager_fallbacks
