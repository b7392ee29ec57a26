"""The interpreter (hence lowering + scheduling) matches eager across ops and dtypes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import check

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64]
ALL = FLOATS + INTS + [torch.bool]


def make(shape, dtype, low=-3, high=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if not dtype.is_floating_point:
        return torch.randint(low, high, shape, generator=g).to(dtype)
    return (torch.rand(shape, generator=g) * (high - low) + low).to(dtype)


def tol(dtype):
    if dtype == torch.float16:
        return dict(atol=2e-3, rtol=2e-3)
    if dtype == torch.bfloat16:
        return dict(atol=2e-2, rtol=2e-2)
    return {}


UNARY_FLOAT = ["sin", "cos", "tan", "exp", "expm1", "log1p", "tanh", "sigmoid", "erf", "atan",
               "sinh", "cosh", "asinh", "exp2", "rsqrt_pos", "sqrt_pos", "log_pos", "log2_pos",
               "reciprocal_pos", "abs", "neg", "floor", "ceil", "round", "trunc", "sign",
               "relu", "gelu", "gelu_tanh", "silu", "softplus", "elu", "leaky_relu", "hardtanh",
               "hardswish", "hardsigmoid", "mish", "isnan", "isinf", "frac", "square"]


def _unary(name):
    if name.endswith("_pos"):
        base = name[:-4]
        return lambda x: getattr(torch, base)(x.abs() + 0.5)
    table = {
        "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "silu": F.silu, "softplus": F.softplus, "elu": F.elu, "leaky_relu": F.leaky_relu,
        "hardtanh": F.hardtanh, "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid,
        "mish": F.mish,
    }
    if name in table:
        f = table[name]
        return lambda x: f(x)
    return getattr(torch, name)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", UNARY_FLOAT)
def test_unary_float(name, dtype):
    x = make((3, 5), dtype)
    check(_unary(name), x, **tol(dtype))


@pytest.mark.parametrize("dtype", INTS + [torch.bool])
@pytest.mark.parametrize("name", ["abs", "neg", "sin", "exp", "sign", "square", "bitwise_not",
                                  "logical_not", "isnan", "floor"])
def test_unary_int_bool(name, dtype):
    if dtype == torch.bool and name in ("abs", "neg", "square", "floor"):
        pytest.skip("eager rejects it")
    x = make((3, 5), dtype)
    fn = getattr(torch, name)
    check(fn, x)


BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
          "remainder", "fmod", "floor_divide", "pow", "atan2", "logical_and", "logical_or",
          "logical_xor"]


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("name", BINARY)
def test_binary(name, dtype):
    a = make((4, 1, 5), dtype, seed=1)
    b = make((3, 1), dtype, seed=2)
    if name in ("remainder", "fmod", "floor_divide", "div") and not dtype.is_floating_point:
        if dtype == torch.bool:
            pytest.skip("eager rejects it")
        b = b.abs() + 1
    if name == "pow":
        if dtype == torch.bool:
            pytest.skip("not interesting")
        a = a.abs() + (1 if not dtype.is_floating_point else 0.5)
        b = b.abs() % 3 if not dtype.is_floating_point else b
    if name == "atan2" and not dtype.is_floating_point:
        pytest.skip("float only")
    if dtype == torch.bool and name in ("sub",):
        pytest.skip("eager rejects it")
    fn = getattr(torch, name)
    check(fn, a, b, **tol(dtype))


@pytest.mark.parametrize("da,db", [(torch.int32, torch.float32), (torch.float16, torch.float32),
                                   (torch.int64, torch.bool), (torch.bfloat16, torch.int32),
                                   (torch.float16, torch.bfloat16), (torch.int32, torch.int64)])
@pytest.mark.parametrize("name", ["add", "mul", "div", "maximum", "lt", "where"])
def test_type_promotion(name, da, db):
    a = make((3, 4), da, seed=3)
    b = make((3, 4), db, seed=4)
    if name == "where":
        fn = lambda a, b: torch.where(a > 0, a, b)
    else:
        fn = getattr(torch, name)
    check(fn, a, b, **tol(torch.bfloat16 if torch.bfloat16 in (da, db) else da))


@pytest.mark.parametrize("dtype", ALL)
def test_scalars(dtype):
    x = make((3, 4), dtype)
    if dtype == torch.bool:
        check(lambda x: (x | True, x & False, x == 0), x)
        return
    check(lambda x: (x + 2, x * 2.5, x - 1, x / 2, x > 1, torch.clamp(x, -1, 2)), x, **tol(dtype))


@pytest.mark.parametrize("src", ALL)
@pytest.mark.parametrize("dst", ALL)
def test_casts(src, dst):
    x = make((4, 3), src) * (3 if src != torch.bool else 1)
    check(lambda x: x.to(dst), x)


@pytest.mark.parametrize("dtype", FLOATS + INTS)
@pytest.mark.parametrize("op", ["sum", "sum0", "sum_all", "amax", "amin", "argmax", "argmin",
                                "max_dim", "min_dim", "prod", "mean", "any", "all", "sum_keep"])
def test_reductions(op, dtype):
    x = make((5, 7), dtype, seed=5)
    fns = {
        "sum": lambda x: x.sum(1),
        "sum0": lambda x: x.sum(0),
        "sum_all": lambda x: x.sum(),
        "sum_keep": lambda x: x.sum(1, keepdim=True) - x,
        "amax": lambda x: x.amax(1),
        "amin": lambda x: x.amin(0),
        "argmax": lambda x: x.argmax(1),
        "argmin": lambda x: x.argmin(),
        "max_dim": lambda x: x.max(1),
        "min_dim": lambda x: x.min(0),
        "prod": lambda x: (x * 0.5 if x.dtype.is_floating_point else x).prod(1),
        "mean": lambda x: x.mean(1),
        "any": lambda x: (x > 1).any(1),
        "all": lambda x: (x > -2).all(0),
    }
    if op == "mean" and not dtype.is_floating_point:
        pytest.skip("eager rejects it")
    if op in ("argmax", "argmin", "max_dim", "min_dim") and dtype != torch.float32:
        x = torch.randperm(35).reshape(5, 7).to(dtype)  # no ties
    t = tol(dtype)
    if dtype == torch.float16 and op in ("sum", "sum0", "sum_all", "prod", "mean"):
        t = dict(atol=1e-2, rtol=1e-2)
    check(fns[op], x, **t)


@pytest.mark.parametrize("dtype", FLOATS)
def test_var_std_logsumexp_softmax(dtype):
    x = make((6, 10), dtype, seed=6)
    t = dict(atol=1e-2, rtol=1e-2) if dtype != torch.float32 else {}
    check(lambda x: (x.var(1), x.std(0), torch.var(x, 1, correction=0),
                     torch.logsumexp(x, 1), torch.softmax(x, -1), torch.log_softmax(x, 0)), x, **t)


@pytest.mark.parametrize("dtype", ALL)
def test_views(dtype):
    x = make((4, 6), dtype, seed=7)
    check(lambda x: (x.t() + 0 if dtype != torch.bool else x.t() | False,
                     x.view(2, 12).clone(), x.reshape(24)[3:20:2].clone(),
                     x[1].clone(), x[:, 2:5].clone(), x.unsqueeze(1).expand(4, 3, 6).clone(),
                     x.permute(1, 0).reshape(3, 8).clone(), x.flip(0).clone(), x.repeat(2, 1).clone()), x)


def test_views_outputs_alias():
    x = torch.randn(4, 6)
    check(lambda x: (x.t(), x[1:3], x.view(24), x.unsqueeze(0)), x)


@pytest.mark.parametrize("dtype", ALL)
def test_cat_pad_where(dtype):
    a = make((3, 4), dtype, seed=8)
    b = make((3, 2), dtype, seed=9)
    check(lambda a, b: (torch.cat([a, b, a], 1), torch.cat([a, a], 0),
                        F.pad(a, (1, 2, 0, 1), value=1) if dtype != torch.bool else F.pad(a, (1, 2)),
                        torch.where(a == b[:, :1], a, b[:, 1:])), a, b)


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_indexing(dtype):
    x = make((6, 5), dtype, seed=10)
    idx = torch.tensor([0, 5, -1, 2])
    idx2 = torch.tensor([[1, 0, 4, 2, 3]] * 6)
    emb = make((10, 4), dtype, seed=11)
    ids = torch.tensor([[1, 2], [9, 0]])
    check(lambda x, idx, idx2, emb, ids: (x[idx], x[:, idx[2:]], torch.gather(x, 1, idx2),
                                          torch.index_select(x, 0, idx[:2] % 6),
                                          F.embedding(ids, emb), x[idx, idx[:1] + 1]),
          x, idx, idx2, emb, ids)


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_creation(dtype):
    x = make((3, 4), dtype)
    check(lambda x: (torch.zeros_like(x), torch.ones(3, dtype=dtype), torch.full((2, 2), 3, dtype=dtype),
                     torch.arange(5, dtype=dtype), torch.arange(2, 11, 3) + x[0, 0].to(torch.int64),
                     x + torch.arange(4, dtype=dtype)), x)


def test_layer_norm_gelu_groups():
    x = torch.randn(8, 32)
    w, b = torch.randn(32), torch.randn(32)
    sched, _ = check(lambda x, w, b: F.gelu(F.layer_norm(x, (32,), w, b)), x, w, b, atol=1e-5)
    assert len(sched.groups) <= 2
    assert sum(1 for g in sched.groups if g.is_reduction()) == 1


def test_softmax_one_group():
    x = torch.randn(8, 32)
    sched, _ = check(lambda x: torch.softmax(x, -1), x)
    assert len(sched.groups) == 1
    g = sched.groups[0]
    assert [n.kind for n in g.nodes] == ["reduction", "reduction", "pointwise"]


def test_mm_extern_and_fusion_around():
    x, w = torch.randn(4, 8), torch.randn(6, 8)
    sched, graph = check(lambda x, w: torch.relu(x.sin() @ w.t() + 1), x, w, atol=1e-5)
    assert len(sched.externs) == 1


def test_fallback_unknown_op():
    from kiln_loopir import counters

    x = torch.randn(4, 8)
    before = counters["aten_fallbacks"].get("aten::special_i1.default", 0)
    check(lambda x: torch.special.i1(x.sin()).cos(), x)
    assert counters["aten_fallbacks"]["aten::special_i1.default"] == before + 1


def test_fallback_multi_output():
    x = torch.randn(4, 8)
    check(lambda x: (torch.sort(x, 1)[0] * 2, torch.topk(x, 3).indices), x)


@pytest.mark.parametrize("exponent", [1, 2, 3, 2.0, 3.0, 0.5, -1.0, -2.0, -0.5, 1.5])
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float16, torch.float32])
def test_pow_scalar_exponent_dtypes(dtype, exponent):
    """``x ** e`` for the exponents lowered as products or reciprocals: an integer or bool
    tensor to a float power is a float tensor, as eager's (``x ** 2.0``, ``x ** -1.0``)."""
    x = make((5,), dtype, low=1, high=4, seed=11)
    check(lambda x: x ** exponent, x, **tol(dtype))
