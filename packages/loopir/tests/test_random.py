"""Random ops as philox ops (lowerings/random.py) on loopir's interpreter: statistics, dropout,
seeds and offsets, and the policy that keeps eager's generator (CPU default, fallback_random)."""

from __future__ import annotations

import kiln_loopir as K
import pytest
import sympy
import torch
from kiln_loopir import counters, philox
from kiln_loopir.lowerings.random import PhiloxState, philox_applies, random_numbers
from torch.fx.experimental.proxy_tensor import make_fx

aten = torch.ops.aten


def _lower(fn, *args, policy="philox"):
    """fn traced to ATen as is (no decompositions), lowered under ``policy``, interpreted."""
    gm = make_fx(fn)(*args)
    with random_numbers(policy):
        graph = K.lower(gm, list(args))
    return K.interpret(K.schedule(graph)), graph


def _seeded(run, seed, *args):
    torch.manual_seed(seed)
    return run(*args)


def test_rand_and_randn_statistics():
    run, graph = _lower(lambda x: (torch.rand(100_000), torch.randn(100_000)), torch.empty(1))
    u, n = _seeded(run, 0, torch.empty(1))
    assert u.dtype == n.dtype == torch.float32
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.005
    assert abs(float(n.mean())) < 0.02 and abs(float(n.var()) - 1.0) < 0.03
    text = str(graph)
    assert "ops.rand(" in text and "ops.randn(" in text and "aten.randint.low" in text


def test_numbers_are_philox_of_the_seed_and_each_elements_offset():
    """Op k of a graph draws offsets base_k + linear index (base_k = numels before it)."""
    run, _ = _lower(lambda x: (torch.rand_like(x), torch.rand(3, 5)), torch.empty(4, 6))
    torch.manual_seed(7)
    a, b = run(torch.empty(4, 6))
    torch.manual_seed(7)  # the wrapper's seed draw: randint(-2**63, 2**63 - 1, [1])
    seed = aten.randint.low(-(2**63), 2**63 - 1, [1], dtype=torch.int64, device="cpu")
    torch.testing.assert_close(a, philox.uniform(seed, torch.arange(24)).view(4, 6), rtol=0, atol=0)
    torch.testing.assert_close(b, philox.uniform(seed, 24 + torch.arange(15)).view(3, 5), rtol=0, atol=0)


def test_same_seed_same_numbers_calls_and_recompiles_differ_or_agree():
    fn = lambda x: torch.rand_like(x) + torch.randn_like(x)  # noqa: E731
    x = torch.empty(8, 16)
    run, _ = _lower(fn, x)
    first = _seeded(run, 3, x)[0]
    again = _seeded(run, 3, x)[0]
    next_call = run(x)[0]
    rerun, _ = _lower(fn, x)  # a recompile of the same graph
    recompiled = _seeded(rerun, 3, x)[0]
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    torch.testing.assert_close(first, recompiled, rtol=0, atol=0)
    assert not torch.equal(first, next_call)


def test_ops_of_one_graph_draw_distinct_numbers():
    run, _ = _lower(lambda x: (torch.rand_like(x), torch.rand_like(x)), torch.empty(64))
    a, b = run(torch.empty(64))
    assert not torch.isin(a, b).any()


def test_native_dropout_mask_fraction_and_exact_scaling():
    p = 0.3
    x = torch.randn(200, 500)
    run, graph = _lower(lambda x: aten.native_dropout.default(x, p, True), x)
    out, mask = _seeded(run, 0, x)
    assert mask.dtype == torch.bool and out.shape == x.shape
    assert abs(1.0 - float(mask.float().mean()) - p) < 0.01  # fraction zeroed ~ p
    scale = 1.0 / (1.0 - p)
    torch.testing.assert_close(out, x * mask * scale, rtol=0, atol=0)
    torch.testing.assert_close(out[mask], x[mask] * scale, rtol=0, atol=0)  # kept: scaled by 1/(1-p)
    assert (out[~mask] == 0).all()
    assert sum("ops.rand(" in line for line in str(graph).splitlines()) == 2  # one per output,
    # of the same (seed, offset): the same mask in both, whichever kernel computes it


def test_native_dropout_half_and_p_one():
    x = torch.randn(64, 32, dtype=torch.float16)
    run, _ = _lower(lambda x: aten.native_dropout.default(x, 1.0, True), x)
    out, mask = run(x)
    assert out.dtype == torch.float16 and not mask.any() and (out == 0).all()


def test_bernoulli_p_and_bernoulli_of_probabilities():
    x = torch.empty(100_000)
    run, _ = _lower(lambda x: aten.bernoulli.p(x, 0.25), x)
    (b,) = run(x)
    assert b.dtype == torch.float32 and set(b.unique().tolist()) <= {0.0, 1.0}
    assert abs(float(b.mean()) - 0.25) < 0.01
    probs = torch.tensor([0.0, 1.0] * 50)
    run, _ = _lower(lambda p: aten.bernoulli.default(p), probs)
    torch.testing.assert_close(run(probs)[0], probs, rtol=0, atol=0)


def test_randint_range_and_dtype():
    run, _ = _lower(lambda x: (torch.randint(3, 10, (50_000,)),
                               torch.randint_like(x, 7), torch.randint(0, 5, (4,), dtype=torch.float32)),
                    torch.empty(1000, dtype=torch.int32))
    a, b, c = run(torch.empty(1000, dtype=torch.int32))
    assert a.dtype == torch.int64 and b.dtype == torch.int32 and c.dtype == torch.float32
    assert set(a.unique().tolist()) == set(range(3, 10))
    assert int(b.min()) >= 0 and int(b.max()) < 7
    assert abs(float(a.float().mean()) - 6.0) < 0.05


def test_uniform_normal_exponential():
    x = torch.empty(100_000, dtype=torch.float64)
    mean = torch.tensor([[-3.0], [5.0]])
    run, _ = _lower(lambda x, m: (aten.uniform.default(x, -2.0, 4.0), aten.exponential.default(x, 4.0),
                                  aten.normal.Tensor_float(m.expand(2, 50_000), 0.5),
                                  aten.normal.float_Tensor(1.0, m.abs().expand(2, 50_000)),
                                  aten.normal.float_float(2.0, 3.0, [100_000])), x, mean)
    u, e, n1, n2, n3 = run(x, mean)
    assert u.dtype == e.dtype == torch.float64 and n3.dtype == torch.float32
    assert -2.0 <= float(u.min()) and float(u.max()) < 4.0 and abs(float(u.mean()) - 1.0) < 0.03
    assert float(e.min()) >= 0.0 and abs(float(e.mean()) - 0.25) < 0.01
    torch.testing.assert_close(n1.mean(1), mean[:, 0], atol=0.02, rtol=0)
    torch.testing.assert_close(n1.std(1), torch.tensor([0.5, 0.5]), atol=0.02, rtol=0)
    torch.testing.assert_close(n2.std(1), torch.tensor([3.0, 5.0]), atol=0.1, rtol=0)
    assert abs(float(n3.mean()) - 2.0) < 0.05 and abs(float(n3.std()) - 3.0) < 0.05


def test_randint_wider_than_2_pow_31_keeps_eagers_generator():
    counters.clear()
    _lower(lambda x: torch.randint(0, 2**40, (8,)), torch.empty(1))
    assert counters["aten_fallbacks"]["aten::randint.low"] == 1


def test_dynamic_sizes_offsets_are_size_expressions():
    x = torch.empty(5, 7)
    gm = make_fx(lambda x: (torch.rand_like(x), torch.rand_like(x)), tracing_mode="symbolic")(x)
    with random_numbers("philox"):
        graph = K.lower(gm, [x])
    offsets = [line for line in str(graph).splitlines() if "ops.index_expr(" in line]
    assert any("s0*s1" in line for line in offsets), offsets  # the second op starts after the first
    a, b = K.interpret(K.schedule(graph))(torch.empty(3, 9))
    assert a.shape == (3, 9) and not torch.isin(a, b).any()


def test_eager_policy_and_cpu_auto_keep_eagers_generator():
    """On CPU (the C++ codegen has no philox ops) random ops are the aten call: the same
    numbers as eager with the same seed."""
    x = torch.randn(32, 32)

    def fn(x):
        return aten.native_dropout.default(x, 0.5, True)[0] + torch.rand_like(x)

    for policy in ("auto", "eager"):
        counters.clear()
        run, graph = _lower(fn, x, policy=policy)
        assert "ops.rand" not in str(graph)
        assert counters["aten_fallbacks"]["aten::native_dropout.default"] == 1
        torch.manual_seed(5)
        want = fn(x)
        torch.testing.assert_close(_seeded(run, 5, x)[0], want, rtol=0, atol=0)
    assert not philox_applies(torch.device("cpu"))
    with random_numbers("philox"):
        assert philox_applies(torch.device("cpu"))


def test_policy_names_and_state_print():
    with pytest.raises(ValueError, match="unknown random-number policy 'always'"):
        with random_numbers("always"):
            pass
    st = PhiloxState(K.ir.InputBuffer("buf0", K.Layout("cpu", torch.int64, [1], [1]), 0), sympy.Integer(0))
    assert st.take(sympy.Symbol("s0")) == 0 and st.take(4) == sympy.Symbol("s0")
    assert str(st) == "PhiloxState(seed buf0, next offset s0 + 4)"
