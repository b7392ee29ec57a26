"""Philox random ops on a GPU (marker ``cuda``): compiled Triton kernels draw the reference
Philox's numbers, ``torch.manual_seed`` reproduces them, and CUDA-graph replays draw fresh
ones. Needs an NVIDIA GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


@pytest.fixture
def kiln(monkeypatch):
    import kiln

    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")
    kiln.reset_stats()
    return kiln


def _random_fallbacks(kiln) -> dict:
    return {op: n for op, n in kiln.stats().aten_fallbacks.items()
            if any(r in op for r in ("rand", "bernoulli", "dropout"))}


def _seeded(fn, seed, *args):
    torch.manual_seed(seed)
    return fn(*args)


def test_compiled_rand_is_the_reference_philox(kiln):
    from kiln_loopir import philox

    x = torch.empty(3000, device="cuda")
    compiled = kiln.compile(lambda x: torch.rand_like(x))
    got = _seeded(compiled, 5, x)
    torch.manual_seed(5)  # the wrapper's seed draw
    seed = torch.ops.aten.randint.low(-(2**63), 2**63 - 1, [1], dtype=torch.int64, device="cuda")
    torch.testing.assert_close(got, philox.uniform(seed, torch.arange(3000, device="cuda")), rtol=0, atol=0)
    assert not _random_fallbacks(kiln) and kiln.stats().kernels_generated >= 1


def test_dropout_on_cuda_is_reproducible_and_fused(kiln):
    p = 0.2
    x = torch.randn(256, 1024, device="cuda", dtype=torch.float16) + 4

    def f(x):
        return F.dropout(x, p, training=True) * 2

    compiled = kiln.compile(f)
    a, b, c = _seeded(compiled, 1, x), _seeded(compiled, 1, x), compiled(x)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)
    assert abs(1.0 - float((a != 0).float().mean()) - p) < 0.01
    assert not _random_fallbacks(kiln), kiln.stats().aten_fallbacks


def test_fallback_random_on_cuda_is_eagers_stream(kiln):
    x = torch.randn(64, 64, device="cuda")

    def f(x):
        return F.dropout(x, 0.5, training=True) + 1

    compiled = kiln.compile(f, options={"fallback_random": True})
    got = _seeded(compiled, 3, x)
    torch.testing.assert_close(got, _seeded(f, 3, x), rtol=0, atol=0)


def test_cuda_graph_replays_draw_fresh_numbers_and_follow_the_seed(kiln):
    x = torch.empty(4096, device="cuda")
    compiled = kiln.compile(lambda x: torch.rand_like(x) + x, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):  # warm-up and record
            compiled(x)
        draws = [compiled(x).clone() for _ in range(3)]
        assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])
        a = _seeded(compiled, 7, x).clone()
        b = _seeded(compiled, 7, x).clone()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert kiln.stats().cudagraphs_recorded >= 1
