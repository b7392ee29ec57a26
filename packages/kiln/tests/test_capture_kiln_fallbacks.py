"""Data-dependent and sparse graphs end to end through the ``kiln`` backend (issue 10/11):
every answer is eager's, and what the backend cannot compile runs eagerly with a log line on
logger ``kiln`` (never an exception reaching the user).

- ``torch.equal``/``allclose`` and ops that call them (``cov``, ``corrcoef``) return Python
  values computed from data: the frontend graph-breaks before them, as torch.compile does.
- ``t.item()`` graph-breaks by default (the graphs on both sides compile); captured (an
  unbacked symbol, under ``fullgraph`` or ``config.capture_scalar_outputs``), a graph whose
  float item or int item used as a size loopir cannot bind at run time runs eagerly
  ("loopir cannot lower").
- Sparse inputs never reach loopir: the frontend breaks, and the backend itself, handed a
  graph with a sparse input, runs it eagerly."""

from __future__ import annotations

import logging
import warnings

import kiln
import pytest
import torch
from kiln_frontend import config, reset


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    kiln.reset()
    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
    yield
    kiln.reset()
    reset()


def _item_slice(x, n):
    return x[: n.item()] * 2


def _item_arange(x, n):
    return torch.arange(n.item()) + x.sum()


def _float_item(x, n):
    return x * x.max().item()


def _equal(x, n):
    return torch.equal(x, x * 1) and n.sum() > 0


def _allclose(x, n):
    return torch.allclose(x, x + 1e-9)


def _cov(x, n):
    return torch.cov(x.reshape(2, -1)) + 1


@pytest.mark.parametrize("capture_scalars", [None, True], ids=["break", "capture"])
@pytest.mark.parametrize("backend", ["kiln", "loopir_interpret"])
@pytest.mark.parametrize("fn", [_item_slice, _item_arange, _float_item, _equal, _allclose, _cov],
                         ids=lambda f: f.__name__.strip("_"))
def test_data_dependent_answers_are_eagers(fn, backend, capture_scalars, caplog):
    compiled = kiln.compile(fn, backend=backend)
    with caplog.at_level(logging.INFO, logger="kiln"), \
            config.patch(capture_scalar_outputs=capture_scalars):
        for n in (3, 5):
            x = torch.randn(8)
            torch.testing.assert_close(compiled(x, torch.tensor(n)), fn(x, torch.tensor(n)))
    stats = kiln.stats()
    if fn in (_item_slice, _item_arange, _float_item):
        if capture_scalars:  # captured, then declined by loopir
            assert stats.eager_fallbacks >= 1, stats
            assert stats.fallback_reasons.get("loopir cannot lower"), stats
            assert "running this graph eagerly" in caplog.text
        else:  # a graph break: the graphs around it compile
            assert stats.eager_fallbacks == 0, stats
            assert stats.graphs_compiled + stats.graphs_interpreted >= 1, stats


def test_item_size_symbol_without_source_is_a_lowering_error():
    """loopir refuses a size it cannot bind at run time (it used to generate code reading an
    undefined ``s1``)."""
    import kiln_aotgrad
    import kiln_loopir

    gm = torch.fx.symbolic_trace(lambda x, n: x[: n.item()] * 2)
    x, n = torch.randn(8), torch.tensor(3)
    kiln_gm = kiln_aotgrad.trace_inference(gm, [x, n])
    with pytest.raises(kiln_loopir.LoweringError, match="have no source"):
        kiln_loopir.lower(kiln_gm)


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("backend", ["kiln_backend", "loopir_interpret_backend"])
def test_backend_runs_a_graph_with_a_sparse_input_eagerly(layout, backend, caplog):
    import kiln.backend as kb

    class MmPlusOne(torch.nn.Module):
        def forward(self, s, y):
            return (torch.mm(s, y) + 1,)

    d = torch.randn(4, 4).relu()
    s = d.to_sparse() if layout == "coo" else d.to_sparse_csr()
    y = torch.randn(4, 3)
    gm = torch.fx.symbolic_trace(MmPlusOne())
    with caplog.at_level(logging.INFO, logger="kiln"):
        compiled = getattr(kb, backend)(gm, [s, y])
    torch.testing.assert_close(compiled(s, y)[0], torch.mm(d, y) + 1)
    assert f"input 0 is a sparse_{layout} tensor" in caplog.text
    assert kiln.stats().eager_fallbacks == 1


def test_sparse_through_kiln_compile():
    def f(s, y):
        return torch.mm(s, y * 2).relu()

    s, y = torch.randn(4, 4).relu().to_sparse_csr(), torch.randn(4, 3)
    torch.testing.assert_close(kiln.compile(f)(s, y), f(s, y))
