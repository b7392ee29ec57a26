"""Odd layouts and sizes: scalars, empty tensors, strided/offset/expanded inputs, float64,
small integer types, complex (fallback)."""

from __future__ import annotations

import pytest
import torch
from helpers import check


def test_scalar_inputs_and_outputs():
    x = torch.tensor(2.5)
    y = torch.randn(3)
    check(lambda x, y: (x * 2, (y * x).sum(), x + y, y.max()), x, y)


def test_empty_tensors():
    x = torch.randn(0, 4)
    y = torch.randn(3, 0)
    check(lambda x, y: (x.sin(), x.sum(0), y.sum(1), y.prod(1), torch.cat([x, x]) * 2), x, y)


def test_noncontiguous_offset_expanded_inputs():
    base = torch.randn(6, 8)
    xt = base.t()  # transposed
    xo = base[1:, 2:]  # storage offset, strided
    xe = torch.randn(1, 6).expand(5, 6)  # stride 0
    check(lambda a, b, c: (a.cos() + 1, b * 2, c + b, (a.t()[1:, 2:] - b).abs().sum(1)), xt, xo, xe)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int8, torch.uint8, torch.int16])
def test_other_dtypes(dtype):
    if dtype.is_floating_point:
        x = torch.randn(4, 5, dtype=dtype)
    else:
        x = torch.randint(0, 10, (4, 5)).to(dtype)
    check(lambda x: (x + x, x * 3, x.sum(1), x.amax(0), x > 4, x.to(torch.float32) / 3), x)


def test_complex_falls_back():
    from kiln_loopir import counters

    x = torch.randn(3, 4, dtype=torch.complex64)
    before = counters["aten_fallbacks"].get("aten::mul.Tensor", 0)
    check(lambda x: (x * x + 1, x.abs()), x)
    assert counters["aten_fallbacks"]["aten::mul.Tensor"] == before + 1


def test_bool_outputs_and_int_division():
    a = torch.randint(-9, 9, (4, 5))
    b = torch.randint(1, 5, (4, 5))
    check(lambda a, b: (a // b, a % b, torch.div(a, b, rounding_mode="trunc"), a / b,
                        torch.fmod(a, b), (a > 0) & (b > 2), a << 1, a >> 1), a, b)


def test_nan_inf_semantics():
    x = torch.tensor([[1.0, float("nan"), 3.0], [float("-inf"), 2.0, float("inf")]])
    check(lambda x: (x.amax(1), x.amin(1), x.argmax(1), x.argmin(1), torch.maximum(x, x.flip(1)),
                     x.clamp(0, 2), torch.nan_to_num(x), x.isnan(), torch.softmax(x, 1)), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pooling(dtype):
    import torch.nn.functional as F
    from kiln_loopir import counters

    x = torch.randn(2, 3, 9, 10).to(dtype)
    tol = {} if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    before = dict(counters["aten_fallbacks"])
    check(lambda x: (F.max_pool2d(x, 3, 2, 1, return_indices=True), F.max_pool2d(x, 2),
                     F.max_pool2d(x, 3, 2, 1, ceil_mode=True),
                     F.avg_pool2d(x, 3, 2, 1), F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
                     F.avg_pool2d(x, 2), F.adaptive_avg_pool2d(x, 1), F.adaptive_avg_pool2d(x[..., :8], (3, 4)),
                     F.avg_pool2d(x, (9, 6))), x, **tol)
    after = dict(counters["aten_fallbacks"])
    assert before == after, (before, after)


def test_data_dependent_sizes_and_random_ops():
    from helpers import compile_loopir

    x = torch.randn(6, 5)
    run, sched, graph = compile_loopir(lambda x: (x[x > 0] * 2).sum(), x)
    torch.testing.assert_close(run(x)[0], (x[x > 0] * 2).sum())
    run, sched, graph = compile_loopir(lambda x: torch.nonzero(x > 0).float().mean(0) + 1, x)
    torch.testing.assert_close(run(x)[0], torch.nonzero(x > 0).float().mean(0) + 1)
    run, sched, graph = compile_loopir(lambda x: torch.rand_like(x) * 0 + x.sin(), x)
    torch.testing.assert_close(run(x)[0], x.sin())


def test_unbacked_size_from_an_extern():
    import kiln_loopir as K
    from helpers import aten_graph

    def f(x):
        return (torch.nonzero(x > 0).float() * 2,)

    gm = aten_graph(f, torch.randn(6, 5), mode="symbolic")
    graph = K.lower(gm)
    assert any(src.buffer is not None for src in graph.sizevars.values())
    fn = K.interpret(K.schedule(graph))
    for seed in range(3):
        x = torch.randn(6, 5, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(fn(x)[0], f(x)[0])
