"""Philox random numbers in Triton kernels (TRITON_INTERPRET=1): loopir's reference Philox is
Triton's ``tl.rand``/``tl.randn``; random ops compile to generated kernels (no aten call), are
reproducible under ``torch.manual_seed`` and train with the forward's dropout mask."""

from __future__ import annotations

import kiln_loopir as K
import pytest
import torch
import torch.nn.functional as F
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


def _stats(kiln):
    s = kiln.stats()
    return s, {op for op in s.aten_fallbacks if any(r in op for r in ("rand", "bernoulli", "dropout"))}


def test_kiln_compile_dropout_is_a_generated_kernel_and_reproducible(monkeypatch):
    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")
    kiln = pytest.importorskip("kiln")  # the full install (nox -s tests)
    kiln.reset_stats()
    p = 0.25

    def f(x):
        return F.dropout(x, p, training=True) + 0.0 * torch.rand_like(x)

    compiled = kiln.compile(f, options={"codegen": "triton"})
    x = torch.randn(40, 50) + 3.0  # no zeros of its own
    a = _seeded(compiled, 1, x)
    b = _seeded(compiled, 1, x)
    c = compiled(x)
    s, random_fallbacks = _stats(kiln)
    assert s.kernels_generated > 0 and not random_fallbacks and s.eager_fallbacks == 0, s
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)
    mask = a != 0
    assert abs(1.0 - float(mask.float().mean()) - p) < 0.03
    # the decomposition's x * (bernoulli(1 - p) / (1 - p)), exactly
    torch.testing.assert_close(a, x * (mask.float() / (1 - p)), rtol=0, atol=0)


def test_fallback_random_keeps_eagers_generator(monkeypatch):
    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")
    kiln = pytest.importorskip("kiln")
    kiln.reset_stats()

    def f(x):
        return F.dropout(x, 0.5, training=True) * 2

    compiled = kiln.compile(f, options={"codegen": "triton", "fallback_random": True})
    x = torch.randn(16, 16)
    got = _seeded(compiled, 4, x)
    torch.manual_seed(4)
    torch.testing.assert_close(got, f(x), rtol=0, atol=0)  # eager's stream, same seed
    assert _stats(kiln)[1], "the random op should be an aten call"


def test_cpu_default_codegen_dropout_matches_eager(monkeypatch):
    """On CPU (the C++ codegen) dropout keeps eager's generator: same seed, same result."""
    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")
    kiln = pytest.importorskip("kiln")
    pytest.importorskip("kiln_codegen_cpp")

    def f(x):
        return F.dropout(x, 0.5, training=True) + torch.rand_like(x)

    compiled = kiln.compile(f)
    x = torch.randn(8, 24)
    got = _seeded(compiled, 9, x)
    torch.manual_seed(9)
    torch.testing.assert_close(got, f(x), rtol=0, atol=0)


class _DropoutMLP(torch.nn.Module):
    def __init__(self, p):
        super().__init__()
        self.fc1, self.fc2, self.p = torch.nn.Linear(12, 48), torch.nn.Linear(48, 3), p

    def forward(self, x):
        h = F.dropout(torch.tanh(self.fc1(x)), self.p, training=True)
        return self.fc2(h), h  # h: the mask is where it is zero


def test_training_through_triton_uses_the_forwards_mask(monkeypatch):
    """Grads of a compiled MLP with dropout equal eager autograd's with the compiled forward's
    mask (recovered from the dropout output's zeros)."""
    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")
    kiln = pytest.importorskip("kiln")
    kiln.reset_stats()
    torch.manual_seed(0)
    p = 0.4
    model = _DropoutMLP(p)
    ref = _DropoutMLP(p)
    ref.load_state_dict(model.state_dict())
    compiled = kiln.compile(model, options={"codegen": "triton"})
    x = torch.randn(16, 12)
    out, h = compiled(x)
    out.square().mean().backward()
    mask = h.detach() != 0
    assert 0 < int(mask.sum()) < mask.numel()

    h_ref = torch.tanh(ref.fc1(x)) * mask / (1 - p)
    out_ref = ref.fc2(h_ref)
    out_ref.square().mean().backward()
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-6)
    for (name, a), (_, b) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=f"grad of {name}")
    s, random_fallbacks = _stats(kiln)
    assert s.forward_graphs_compiled >= 1 and s.backward_graphs_compiled >= 1, s
    assert not random_fallbacks and s.eager_fallbacks == 0, s


def test_partitioner_saves_the_mask_and_never_recomputes_random_ops():
    kiln_aotgrad = pytest.importorskip("kiln_aotgrad")
    model = _DropoutMLP(0.5)
    x = torch.randn(4, 12)
    joint = kiln_aotgrad.trace_joint(torch.fx.symbolic_trace(model), [x])
    for budget in (1.0, 0.1):  # even under a tight memory budget
        part = kiln_aotgrad.partition(joint, "min_cut", budget)
        bw_targets = {str(n.target) for n in part.bw_gm.graph.nodes if n.op == "call_function"}
        fw_targets = {str(n.target) for n in part.fw_gm.graph.nodes if n.op == "call_function"}
        assert not any("bernoulli" in t or "rand" in t for t in bw_targets), bw_targets
        assert any("bernoulli" in t for t in fw_targets)
    assert not [op for op in kiln_aotgrad.RECOMPUTABLE
                if any(r in str(op) for r in ("rand", "bernoulli", "dropout", "normal", "uniform"))]
