"""Philox random numbers in Triton kernels (TRITON_INTERPRET=1): loopir's reference Philox is
Triton's ``tl.rand``/``tl.randn``; random ops compile to generated kernels (no aten call), are
reproducible under ``torch.manual_seed`` (through kiln.compile and in training: kiln's
test_triton_via_kiln.py)."""

from __future__ import annotations

import kiln_loopir as K
import pytest
import torch
import triton
import triton.language as tl
from kiln_codegen_triton import compile_schedule
from kiln_loopir import counters, philox
from kiln_loopir.lowerings.random import random_numbers
from torch.fx.experimental.proxy_tensor import make_fx

aten = torch.ops.aten

SEEDS = [0, 1, 12345, 2**40 + 7, -5, -(2**63), 2**63 - 1]


@triton.jit
def _draw(out_u, out_n, out_w0, out_w1, seed, offsets, N: tl.constexpr):
    i = tl.arange(0, N)
    off = tl.load(offsets + i).to(tl.uint32)
    tl.store(out_u + i, tl.rand(seed, off))
    tl.store(out_n + i, tl.randn(seed, off))
    w0, w1, _, _ = tl.randint4x(seed, off)
    tl.store(out_w0 + i, w0.to(tl.int64) & 0xFFFFFFFF)
    tl.store(out_w1 + i, w1.to(tl.int64) & 0xFFFFFFFF)


@pytest.mark.parametrize("seed", SEEDS)
def test_reference_philox_is_tritons_bit_for_bit(seed):
    n = 2048
    gen = torch.Generator().manual_seed(abs(seed) % 1000)
    offsets = torch.cat([torch.arange(n // 4), 2**31 - n // 8 + torch.arange(n // 4),
                         torch.randint(0, 2**32, (n // 4,), generator=gen),
                         torch.randint(2**32, 2**40, (n // 4,), generator=gen)])  # low 32 bits count
    u, nrm = torch.empty(n), torch.empty(n)
    w0, w1 = torch.empty(n, dtype=torch.int64), torch.empty(n, dtype=torch.int64)
    _draw[(1,)](u, nrm, w0, w1, seed, offsets, n)
    seed_t = torch.tensor(seed)
    c0, c1, _, _ = philox.philox4x32(seed_t, offsets)
    torch.testing.assert_close(c0, w0, rtol=0, atol=0)
    torch.testing.assert_close(c1, w1, rtol=0, atol=0)
    torch.testing.assert_close(philox.uniform(seed_t, offsets), u, rtol=0, atol=0)
    # Box-Muller's log/cos: each platform's libm, within a few float32 ulps
    torch.testing.assert_close(philox.normal(seed_t, offsets), nrm, rtol=2e-6, atol=1e-6)


def _compile(fn, *args):
    """fn traced to ATen as is, lowered with philox ops: (Triton-compiled, interpreted)."""
    gm = make_fx(fn)(*args)
    with random_numbers("philox"):
        graph = K.lower(gm, list(args))
    sched = K.schedule(graph)
    return compile_schedule(sched), K.interpret(sched)


def _seeded(run, seed, *args):
    torch.manual_seed(seed)
    return run(*args)


def test_generated_kernels_draw_the_interpreters_numbers():
    def fn(x):
        out, mask = aten.native_dropout.default(x, 0.4, True)
        return (out, mask, torch.rand_like(x), torch.randint(-3, 9, (7, 11)),
                aten.bernoulli.p(x, 0.2), aten.uniform.default(x, -1.0, 2.0),
                aten.exponential.default(x, 2.0), torch.randn(5, 6))

    x = torch.randn(33, 65)
    counters.clear()
    compiled, interpreted = _compile(fn, x)
    assert not counters["aten_fallbacks"], counters["aten_fallbacks"]
    text = "\n".join(k.source for k in compiled.module.kernels)
    assert "tl.rand(" in text and "tl.randn(" in text and "_kiln_randint64(" in text
    got, want = _seeded(compiled, 11, x), _seeded(interpreted, 11, x)
    for g, w in zip(got[:-1], want[:-1], strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    torch.testing.assert_close(got[-1], want[-1], rtol=2e-6, atol=1e-6)  # randn: libm


def test_native_dropout_is_one_fused_kernel_with_exact_scaling():
    p = 0.3
    x = torch.randn(64, 300)
    compiled, _ = _compile(lambda x: aten.native_dropout.default(x, p, True), x)
    assert len(compiled.module.kernels) == 1  # mask and scaled output in one kernel
    out, mask = _seeded(compiled, 0, x)
    assert abs(1.0 - float(mask.float().mean()) - p) < 0.02
    torch.testing.assert_close(out, x * mask * (1.0 / (1.0 - p)), rtol=0, atol=0)
