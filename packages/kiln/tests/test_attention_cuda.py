"""Attention on a GPU (marker ``cuda``): half-precision scaled-dot-product attention with a
mask compiles to a fused kernel (an extern call), as eager's dispatcher picks one, never the
float32 math path: in training graphs, where the trace's own choice is the math path, the
memory-efficient kernel and its backward (``kiln_aotgrad.decompositions._sdpa_on_cuda``).
Results and gradients equal eager's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

FUSED = ("aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
         "aten::_scaled_dot_product_flash_attention")

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


@pytest.fixture
def kiln(monkeypatch):
    import kiln

    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")
    kiln.reset()  # each test traces _attention afresh (static sizes)
    kiln.reset_stats()
    return kiln


def _compiled_whole(kiln) -> None:
    """Every graph compiled: no eager fallback (whose eager SDPA would pass the checks too)."""
    stats = kiln.stats()
    assert stats.graphs_compiled >= 1 and stats.eager_fallbacks == 0, stats.fallback_reasons
    assert not stats.compile_failures, stats.compile_failures


def _attention(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125).transpose(1, 2).sum(-1)


def _inputs(seq, requires_grad):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, seq, 4, 64, device="cuda", dtype=torch.float16).transpose(1, 2)
               .detach().requires_grad_(requires_grad) for _ in range(3))
    mask = torch.rand(2, 1, seq, seq, device="cuda") > 0.2
    mask[..., 0] = True  # no row masked whole
    return q, k, v, mask


def _ops_run(fn, *args) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn(*args)
        if out.requires_grad:
            out.float().square().sum().backward()
    return {e.name for e in prof.events()}


@pytest.mark.parametrize("seq", [64, 40])  # 40: the mask's rows padded to 16 elements
def test_masked_half_attention_uses_a_fused_kernel(kiln, seq):
    q, k, v, mask = _inputs(seq, requires_grad=False)
    compiled = kiln.compile(_attention)
    torch.testing.assert_close(compiled(q, k, v, mask), _attention(q, k, v, mask), rtol=2e-3, atol=2e-3)
    ops = _ops_run(compiled, q, k, v, mask)
    assert any(op in ops for op in FUSED) and "aten::bmm" not in ops, ops
    _compiled_whole(kiln)


def test_masked_half_attention_trains_with_the_efficient_backward(kiln):
    q, k, v, mask = _inputs(64, requires_grad=True)
    compiled = kiln.compile(_attention)
    compiled(q, k, v, mask).float().square().sum().backward()
    _compiled_whole(kiln)
    assert kiln.stats().backward_graphs_compiled >= 1
    got = [t.grad for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    _attention(q, k, v, mask).float().square().sum().backward()
    for g, t in zip(got, (q, k, v), strict=True):
        torch.testing.assert_close(g, t.grad, rtol=2e-2, atol=2e-2)
    ops = _ops_run(compiled, q, k, v, mask)
    assert "aten::_scaled_dot_product_efficient_attention_backward" in ops and "aten::bmm" not in ops, ops


def test_masked_half_attention_for_inference_uses_cudnn_where_it_takes_it(kiln):
    """Inference (no grad): cuDNN's fused kernel where torch's own check says it takes the
    tensors (it ran GPT-2's 12 layers in 0.41 ms against the memory-efficient kernel's 1.11);
    the same result as eager's either way."""
    q, k, v, mask = _inputs(64, requires_grad=False)
    params = torch.backends.cuda.SDPAParams(q, k, v, torch.zeros(2, 4, 64, 64, device="cuda", dtype=q.dtype),
                                            0.0, False, False)
    compiled = kiln.compile(_attention)
    torch.testing.assert_close(compiled(q, k, v, mask), _attention(q, k, v, mask), rtol=2e-3, atol=2e-3)
    ops = _ops_run(compiled, q, k, v, mask)
    want = ("aten::_scaled_dot_product_cudnn_attention" if torch.backends.cuda.can_use_cudnn_attention(params)
            else "aten::_scaled_dot_product_efficient_attention")
    assert want in ops and "aten::bmm" not in ops, ops
    _compiled_whole(kiln)
