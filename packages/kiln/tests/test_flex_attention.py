"""FlexAttention through the whole stack (``kiln.compile``, fullgraph=True, C++ codegen): one
graph per pattern, outputs equal to eager ``flex_attention``, gradients (q, k, v and captured
tables) equal to torch's own flex_attention operator run eagerly with its autograd rule
(eager ``flex_attention`` refuses inputs that need grad on the CPU; kiln has a CPU backward).
Also: a BlockMask made inside the compiled function, a changed table, changing shapes."""

from __future__ import annotations

import math
import warnings

import kiln
import pytest
import torch
from torch._higher_order_ops.flex_attention import flex_attention as flex_hop
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

pytestmark = [pytest.mark.usefixtures("needs_cpp"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

B, H, L, D = 2, 2, 32, 8
BLOCK = 16

REL = torch.randn(2 * L, requires_grad=True)  # relative-position bias table (learned)
SLOPES = torch.tensor([0.5, 0.25])  # ALiBi slopes per head
DOCS = torch.tensor([0] * 10 + [1] * 14 + [2] * 8)  # document id per position


# each pattern: score_mod and mask_mod written with their tables as explicit arguments (for
# torch's operator, the reference), and the tables they close over in user code
def _causal(b, h, m, n):
    return m >= n


def _window(b, h, m, n):
    return (m >= n) & (m - n <= 6)


def _docs(b, h, m, n, docs):
    return docs[m] == docs[n]


def _alibi(s, b, h, m, n, slopes):
    return s + slopes[h] * (n - m)


def _rel(s, b, h, m, n, rel):
    return s + rel[m - n + L]


def _softcap(s, b, h, m, n):
    return 20.0 * torch.tanh(s / 20.0)


def _user_docs(b, h, m, n):
    return DOCS[m] == DOCS[n]


def _user_alibi(s, b, h, m, n):
    return s + SLOPES[h] * (n - m)


def _user_rel(s, b, h, m, n):
    return s + REL[m - n + L]


PATTERNS = {
    # name: (user score_mod, user mask_mod: tables closed over as user code writes them;
    #        the same mods with the tables as explicit arguments, for torch's operator;
    #        score tables, mask tables)
    "causal": (None, _causal, None, _causal, (), ()),
    "sliding_window": (None, _window, None, _window, (), ()),
    "alibi": (_user_alibi, None, _alibi, None, (SLOPES,), ()),
    "relative_bias_table": (_user_rel, _causal, _rel, _causal, (REL,), ()),
    "document_mask": (None, _user_docs, None, _docs, (), (DOCS,)),
    "softcap": (_softcap, _causal, _softcap, _causal, (), ()),
}


def _inputs(seed=0, length=L, grad=True):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, length, D, generator=g).requires_grad_(grad) for _ in range(3)]


def _reference(q, k, v, score_mod, score_tables, block_mask, mask_mod, mask_tables):
    """torch's flex_attention operator, eagerly, tables as its buffers (their grads too)."""
    bm = block_mask.as_tuple()[:-1] + (mask_mod or (lambda b, h, m, n: m >= 0),)
    sm = score_mod or (lambda s, b, h, m, n: s)
    return flex_hop(q, k, v, sm, bm, 1.0 / math.sqrt(D), {}, tuple(score_tables),
                    tuple(mask_tables))[0]


@pytest.mark.parametrize("name", list(PATTERNS))
def test_pattern_forward_and_backward_equal_eager(name):
    user_score, user_mask, score_mod, mask_mod, s_tables, m_tables = PATTERNS[name]
    bm = (create_block_mask(user_mask, B, H, L, L, device="cpu", BLOCK_SIZE=BLOCK)
          if user_mask is not None else None)

    def f(q, k, v, block_mask):
        return flex_attention(q, k, v, score_mod=user_score, block_mask=block_mask)

    kiln.reset()
    compiled = kiln.compile(f, fullgraph=True)
    q, k, v = _inputs()
    out = compiled(q, k, v, bm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = f(q.detach(), k.detach(), v.detach(), bm)
    torch.testing.assert_close(out, eager)
    stats = kiln.stats()
    assert stats.eager_fallbacks == 0 and stats.forward_graphs_compiled == 1

    ref_bm = bm if bm is not None else create_block_mask(lambda b, h, m, n: m >= 0, B, H, L, L,
                                                         device="cpu", BLOCK_SIZE=BLOCK)
    ref = _reference(q, k, v, score_mod, s_tables, ref_bm, mask_mod, m_tables)
    torch.testing.assert_close(out, ref)
    wrt = [q, k, v, *[t for t in s_tables if t.requires_grad]]
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, wrt, grad)
    want = torch.autograd.grad(ref, wrt, grad)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert kiln.stats().backward_graphs_compiled == 1


def test_a_changed_table_value_is_seen_without_recompiling():
    table = torch.zeros(2 * L)

    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, m, n: s + table[m - n + L])

    kiln.reset()
    compiled = kiln.compile(f, fullgraph=True)
    q, k, v = _inputs(grad=False)
    first = compiled(q, k, v)
    torch.testing.assert_close(first, f(q, k, v))
    table.copy_(torch.randn(2 * L) * 3)  # the same tensor, new values: a lifted input
    second = compiled(q, k, v)
    torch.testing.assert_close(second, f(q, k, v))
    assert not torch.allclose(first, second)
    assert kiln.stats().graphs_compiled == 1


def test_block_mask_made_inside_the_function_breaks_the_graph_and_stays_correct():
    def f(q, k, v):
        bm = create_block_mask(_window, B, H, q.size(2), k.size(2), device="cpu",
                               BLOCK_SIZE=BLOCK)
        return flex_attention(q, k, v, block_mask=bm) * 2

    kiln.reset()
    compiled = kiln.compile(f)
    q, k, v = _inputs(grad=False)
    torch.testing.assert_close(compiled(q, k, v), f(q, k, v))
    with pytest.raises(Exception, match="create_block_mask|vmap|torch internals"):
        kiln.compile(f, fullgraph=True)(q, k, v)


@pytest.mark.parametrize("length", [16, 48])
def test_changing_sequence_lengths_give_eager_results(length):
    def f(q, k, v, block_mask):
        return flex_attention(q, k, v, block_mask=block_mask)

    kiln.reset()
    compiled = kiln.compile(f)
    for n in (L, length):
        bm = create_block_mask(_causal, B, H, n, n, device="cpu", BLOCK_SIZE=BLOCK)
        q, k, v = _inputs(seed=n, length=n, grad=False)
        torch.testing.assert_close(compiled(q, k, v, bm), f(q, k, v, bm))
