"""``mode="reduce-overhead"`` through the kiln backend (kiln.reduce_overhead ->
kiln_runtime.cudagraphs). The runner's bookkeeping is tested on CPU in
packages/runtime/tests/test_cudagraphs.py; here: the skip on CPU, and the GPU path (``cuda``)."""

from __future__ import annotations

import logging

import kiln
import pytest
import torch
from kiln.backend import kiln_backend
from kiln.reduce_overhead import skip_reason
from torch import nn


def _mlp(device="cpu"):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16)).eval().to(device)


def test_cpu_graph_skips_cuda_graphs_with_a_logged_reason(caplog, needs_cpp):
    m = _mlp()
    gm = torch.fx.symbolic_trace(m)
    x = torch.randn(4, 32)
    kiln.reset_stats()
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="kiln.cudagraphs"):
        compiled = kiln_backend(gm, [x], {"mode": "reduce-overhead"})
        for _ in range(3):
            x = torch.randn(4, 32)
            torch.testing.assert_close(compiled(x), m(x))
    assert "CUDA graphs skipped" in caplog.text and "CPU tensors" in caplog.text
    s = kiln.stats()
    assert s.cudagraph_skips.get("CPU tensors") == 1 and s.cudagraphs_recorded == 0


def test_skip_reasons_from_graph_facts():
    assert skip_reason({"devices": ["cpu"]}).startswith("CPU tensors")
    assert skip_reason({"devices": ["cuda:0"], "data_dependent": True}).startswith("data-dependent")
    assert skip_reason({"devices": ["cuda:0"], "data_dependent": False}) is None


def test_default_mode_does_not_wrap(needs_cpp):
    gm = torch.fx.symbolic_trace(_mlp())
    with torch.no_grad():
        compiled = kiln_backend(gm, [torch.randn(2, 32)])
    assert not hasattr(getattr(compiled, "compiled", None), "runner")


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.cuda
@cuda
def test_reduce_overhead_holds_three_replays_and_matches_eager():
    m = _mlp("cuda")
    kiln.reset_stats()
    compiled = kiln.compile(m, mode="reduce-overhead")
    with torch.no_grad():
        compiled(torch.randn(8, 32, device="cuda"))  # warm-up
        xs = [torch.randn(8, 32, device="cuda") for _ in range(3)]
        held = [compiled(x) for x in xs]
        for x, y in zip(xs, held, strict=True):
            torch.testing.assert_close(y, m(x), rtol=1e-4, atol=1e-4)
        for _ in range(5):
            x = torch.randn(8, 32, device="cuda")
            torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-4)
    s = kiln.stats()
    assert s.cudagraphs_recorded >= 1, s
    assert all(v > 0 for v in s.cudagraph_memory.values()), s.cudagraph_memory
