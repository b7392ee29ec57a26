"""FlexAttention through ``kiln.compile(fullgraph=True)`` with the Triton codegen (Triton's
interpreter on CPU): inference runs one fused kernel (kiln_codegen_triton.flex_attention)
with the mods inlined and the BlockMask's blocks iterated, training a fused forward and a
fused backward; captured tables that need grad, the C++ codegen and inputs the template
refuses keep the dense rule. The choice is made in one place
(``kiln.higher_order.flex_attention_fused``). Small sizes: the interpreter is slow."""

from __future__ import annotations

import math
import warnings

import kiln
import pytest
import torch
from kiln_loopir.lowerings.higher_order import FLEX_KERNELS
from torch._higher_order_ops.flex_attention import flex_attention as flex_hop
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TRITON = {"codegen": "triton"}
B, H, L, D = 1, 2, 40, 8
SLOPES = torch.tensor([0.5, 0.25])
DOCS = torch.tensor([0] * 13 + [1] * 20 + [2] * 7)


def _eager(f, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f(*args)


def _inputs(seed=0, heads=H, grad=False, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, L, D, generator=g, dtype=dtype).requires_grad_(grad)
            for h in (H, heads, heads)]


def _fused_kernels_made(f, *args, options=TRITON):
    """Compile and run ``f``; return its result and how many fused kernels were built."""
    kiln.reset()
    before = len(FLEX_KERNELS)
    out = kiln.compile(f, fullgraph=True, options=options)(*args)
    stats = kiln.stats()
    assert stats.eager_fallbacks == 0 and stats.interpreter_fallbacks == 0, stats
    return out, len(FLEX_KERNELS) - before


def test_document_mask_with_alibi_runs_one_fused_kernel():
    def docs(b, h, m, n):
        return (m >= n) & (DOCS[m] == DOCS[n])

    bm = create_block_mask(docs, B, H, L, L, device="cpu", BLOCK_SIZE=16)

    def f(q, k, v, block_mask):
        out = flex_attention(q, k, v, score_mod=lambda s, b, h, m, n: s + SLOPES[h] * (n - m),
                             block_mask=block_mask)
        return out * 2

    q, k, v = _inputs()
    out, made = _fused_kernels_made(f, q, k, v, bm)
    torch.testing.assert_close(out, _eager(f, q, k, v, bm))
    assert made == 1


def test_grouped_query_attention_without_block_mask_is_fused():
    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, m, n: 10 * torch.tanh(s / 10),
                              enable_gqa=True)

    q, k, v = _inputs(seed=1, heads=1)
    out, made = _fused_kernels_made(f, q, k, v)
    torch.testing.assert_close(out, _eager(f, q, k, v))
    assert made == 1


def _torch_grads(q, k, v, score_mod, tables, bm, mask_mod, grad):
    """torch's flex_attention operator run eagerly with its autograd rule (eager
    flex_attention refuses inputs needing grad on the CPU), tables as its buffers."""
    ref = flex_hop(q, k, v, score_mod, bm.as_tuple()[:-1] + (mask_mod,), 1.0 / math.sqrt(D), {},
                   tuple(tables), ())[0]
    wrt = [q, k, v, *[t for t in tables if t.requires_grad]]
    return ref, torch.autograd.grad(ref, wrt, grad)


def test_training_runs_fused_forward_and_backward_kernels():
    """Under grad the operator's own autograd rule puts flex_attention_backward (score_mod's
    joint graph inside) in the joint graph: two fused kernels, gradients equal to torch's."""
    def causal(b, h, m, n):
        return m >= n

    bm = create_block_mask(causal, B, H, L, L, device="cpu", BLOCK_SIZE=16)

    def f(q, k, v, block_mask):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, m, n: 20 * torch.tanh(s / 20)
                              + SLOPES[h] * (n - m), block_mask=block_mask)

    q, k, v = _inputs(seed=2, grad=True)
    out, made = _fused_kernels_made(f, q, k, v, bm)
    assert made == 2 and kiln.stats().training_graphs == 1
    grad = torch.randn_like(out)
    ref, want = _torch_grads(q, k, v, lambda s, b, h, m, n, t: 20 * torch.tanh(s / 20)
                             + t[h] * (n - m), [SLOPES], bm, causal, grad)
    torch.testing.assert_close(out, ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("strict, with_lse", [(False, True), (True, False)])
def test_fused_backward_with_the_logsumexps_gradient_and_fully_masked_rows(strict, with_lse):
    """The backward's delta kernel subtracts the logsumexp's own gradient (a loss that uses
    ``return_lse``); a strictly causal mask leaves the first query row fully masked, whose
    logsumexp is -inf (the kernels read it as 0: its probabilities are all 0)."""
    def mask(b, h, m, n):
        return m > n if strict else m >= n

    bm = create_block_mask(mask, B, H, L, L, device="cpu", BLOCK_SIZE=16)

    def f(q, k, v, block_mask):
        out, lse = flex_attention(q, k, v, block_mask=block_mask, return_lse=True)
        return out, lse

    q, k, v = _inputs(seed=4, grad=True)
    (out, lse), made = _fused_kernels_made(f, q, k, v, bm)
    assert made == 2
    ref, ref_lse2 = flex_hop(q, k, v, lambda s, b, h, m, n: s, bm.as_tuple()[:-1] + (mask,),
                             1.0 / math.sqrt(D), {}, (), ())[:2]
    ref_lse = ref_lse2 * math.log(2)  # (the operator's logsumexp is base 2, the API's natural)
    torch.testing.assert_close(out, ref)
    grad = torch.randn_like(out)
    if with_lse:
        torch.testing.assert_close(lse, ref_lse)
        glse = torch.randn_like(lse)
        got = torch.autograd.grad((out, lse), (q, k, v), (grad, glse))
        want = torch.autograd.grad((ref, ref_lse), (q, k, v), (grad, glse))
    else:
        got = torch.autograd.grad(out, (q, k, v), grad)
        want = torch.autograd.grad(ref, (q, k, v), grad)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_table_that_needs_grad_keeps_the_dense_rule():
    table = torch.randn(2 * L, requires_grad=True)

    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, m, n: s + table[m - n + L])

    q, k, v = _inputs(seed=4, grad=True)
    out, made = _fused_kernels_made(f, q, k, v)
    assert made == 0
    grad = torch.randn_like(out)
    ref, want = _torch_grads(q, k, v, lambda s, b, h, m, n, t: s + t[m - n + L], [table],
                             create_block_mask(lambda b, h, m, n: m >= 0, B, H, L, L, device="cpu",
                                               BLOCK_SIZE=16), lambda b, h, m, n: m >= 0, grad)
    torch.testing.assert_close(out, ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v, table), grad), want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_cpp_codegen_and_float64_keep_the_dense_rule():
    def f(q, k, v):
        return flex_attention(q, k, v)

    q, k, v = _inputs(seed=3)
    out, made = _fused_kernels_made(f, q, k, v, options={"codegen": "cpp"})
    torch.testing.assert_close(out, _eager(f, q, k, v))
    assert made == 0
    q, k, v = _inputs(seed=3, dtype=torch.float64)
    out, made = _fused_kernels_made(f, q, k, v)
    torch.testing.assert_close(out, _eager(f, q, k, v))
    assert made == 0


def test_heads_transposed_from_the_sequence_layout_fused_with_gradients():
    """q, k, v as transformer code makes them (``[B, L, H, D]`` viewed and transposed) and a
    BlockMask broadcast over batch and heads: the fused kernels read those strides, the
    output has the query's dim order, and the input's gradient equals torch's."""
    w = torch.randn(D, D, generator=torch.Generator().manual_seed(5))

    def causal(b, h, m, n):
        return m >= n

    bm = create_block_mask(causal, 1, 1, L, L, device="cpu", BLOCK_SIZE=16)

    def heads(x):
        xs = x.view(2, L, H, D)
        return (xs @ w).transpose(1, 2), xs.transpose(1, 2), (xs * 2).transpose(1, 2)

    def f(x, block_mask):
        out = flex_attention(*heads(x), block_mask=block_mask)
        return out.transpose(1, 2).reshape(2, L, H * D)

    x = torch.randn(2, L, H * D, generator=torch.Generator().manual_seed(6), requires_grad=True)
    out, made = _fused_kernels_made(f, x, bm)
    assert made == 2
    ref = flex_hop(*heads(x), lambda s, b, h, m, n: s, bm.as_tuple()[:-1] + (causal,),
                   1.0 / math.sqrt(D), {}, (), ())[0].transpose(1, 2).reshape(2, L, H * D)
    torch.testing.assert_close(out, ref)
    grad = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, x, grad)[0],
                               torch.autograd.grad(ref, x, grad)[0], rtol=1e-4, atol=1e-5)


def test_grouped_query_attention_without_block_mask_trains_fused():
    """torch's empty BlockMask (one block of 2**30 per row) and 2 query heads per kv head,
    under grad: dk and dv sum over each kv head's query heads."""
    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, m, n: s + (m - n) * 0.1,
                              enable_gqa=True)

    q, k, v = _inputs(seed=9, heads=1, grad=True)
    out, made = _fused_kernels_made(f, q, k, v)
    assert made == 2
    from torch.nn.attention.flex_attention import _create_empty_block_mask

    grad = torch.randn_like(out)
    ref, want = _torch_grads(q, k, v, lambda s, b, h, m, n: s + (m - n) * 0.1, [],
                             _create_empty_block_mask(q, k), lambda b, h, m, n: m >= 0, grad)
    torch.testing.assert_close(out, ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_short_query_runs_the_decoding_kernel():
    """One query row over a 40-key cache (kiln.higher_order.DECODE_MAX_QUERY): the fused
    forward chosen is the split-KV decoding kernel, equal to eager; a 40-row query over the
    same cache keeps the forward kernel."""
    from kiln_codegen_triton.flex_decoding import FlexDecodingKernel

    def prefix(b, h, m, n):
        return n <= L - 1 + m

    def f(q, k, v, block_mask):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, m, n: s + SLOPES[h] * (n - m),
                              block_mask=block_mask)

    for rows, decoding in ((1, True), (L, False)):
        bm = create_block_mask(prefix, B, H, rows, L, device="cpu", BLOCK_SIZE=16)
        q, k, v = _inputs(seed=5)
        q = q[:, :, :rows].contiguous()
        out, made = _fused_kernels_made(f, q, k, v, bm)
        torch.testing.assert_close(out, _eager(f, q, k, v, bm))
        kernel = FLEX_KERNELS[list(FLEX_KERNELS)[-1]]
        assert made == 1 and isinstance(kernel, FlexDecodingKernel) == decoding
