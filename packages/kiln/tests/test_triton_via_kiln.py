"""kiln.compile with the Triton codegen on CPU tensors (Triton's interpreter: conftest.py turns
it on where there is no GPU), and random ops through it: dropout as a generated kernel,
reproducible under torch.manual_seed, eager's generator under fallback_random, the forward's
mask in training, never recomputed by the partitioner. Here rather than in codegen-triton's
tests: they go through kiln, which codegen-triton does not depend on."""

from __future__ import annotations

import kiln
import kiln.debug as debug
import kiln_aotgrad
import torch
import torch.nn.functional as F


def _seeded(run, seed, *args):
    torch.manual_seed(seed)
    return run(*args)


def test_dynamic_sin_cos_one_kernel_two_stores_wrapper_computes_xnumel():

    def f(x):
        y = x.sin()
        z = y.cos()
        return y, z

    compiled = kiln.compile(f, dynamic=True, options={"codegen": "triton"})
    for shape in [(3, 5), (4, 7)]:
        x = torch.randn(shape)
        for a, e in zip(compiled(x), f(x), strict=True):
            torch.testing.assert_close(a, e)



def test_kiln_compile_with_triton_codegen_runs_generated_kernels(monkeypatch):
    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")  # compile here, not load from an earlier run

    kiln.reset_stats()

    def f(x):
        return torch.tanh(x) * torch.sigmoid(x).sum(-1, keepdim=True)

    compiled = kiln.compile(f, options={"codegen": "triton"})
    x = torch.randn(9, 20)
    torch.testing.assert_close(compiled(x), f(x))
    s = kiln.stats()
    assert s.kernels_generated > 0 and s.interpreter_fallbacks == 0 and s.eager_fallbacks == 0, s


def test_sources_land_in_the_debug_folder(tmp_path, monkeypatch):

    monkeypatch.setattr(debug, "_run_dir", None)  # a fresh run folder, under tmp_path

    compiled = kiln.compile(lambda x: x.exp() + 1, options={"codegen": "triton", "debug": True,
                                                            "debug_dir": str(tmp_path)})
    x = torch.randn(10)
    torch.testing.assert_close(compiled(x), x.exp() + 1)
    text = "\n".join(p.read_text() for p in tmp_path.rglob("output_code.py"))
    assert "@triton.jit" in text and "def call(args)" in text



def _stats(kiln):
    s = kiln.stats()
    return s, {op for op in s.aten_fallbacks if any(r in op for r in ("rand", "bernoulli", "dropout"))}


def test_kiln_compile_dropout_is_a_generated_kernel_and_reproducible(monkeypatch):
    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")
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
