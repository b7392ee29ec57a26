"""FlexAttention capture (kiln_frontend.symbolic.hops.flex_attention): under fullgraph=True one
graph with torch's flex_attention node; score_mod and mask_mod are GraphModule subgraphs, the
tables they close over are lifted into the node's buffers, ``table[q_idx]`` is aten.index, the
BlockMask's tensors are graph inputs; a rebound table global is guarded."""

from __future__ import annotations

import warnings

import pytest
import torch
from _counting_backend import CountingBackend
from kiln_frontend import compile as kiln_compile
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

pytestmark = [pytest.mark.usefixtures("fresh_frontend"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

L = 16
BIAS = torch.randn(2 * L)
DOCS = torch.tensor([0] * 6 + [1] * 10)


def _rel(s, b, h, m, n):
    return s + BIAS[m - n + L]


def _docs(b, h, m, n):
    return (DOCS[m] == DOCS[n]) & (m >= n)


def f(q, k, v, block_mask):
    return flex_attention(q, k, v, score_mod=_rel, block_mask=block_mask)


def _eager(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


def test_flex_attention_is_one_node_with_subgraphs_and_lifted_tables():
    bm = create_block_mask(_docs, 1, 2, L, L, device="cpu", BLOCK_SIZE=8)
    backend = CountingBackend()
    compiled = kiln_compile(f, backend=backend, fullgraph=True)
    q, k, v = (torch.randn(1, 2, L, 8) for _ in range(3))
    torch.testing.assert_close(compiled(q, k, v, bm), _eager(f, q, k, v, bm))
    assert len(backend.graphs) == 1
    gm = backend.graphs[0]
    (node,) = [n for n in gm.graph.nodes
               if n.target is torch.ops.higher_order.flex_attention]
    score_gm = getattr(gm, node.args[3].target)
    mask_gm = getattr(gm, node.args[4][-1].target)
    assert isinstance(score_gm, torch.fx.GraphModule) and isinstance(mask_gm, torch.fx.GraphModule)
    assert "aten.index.Tensor" in score_gm.code and "aten.index.Tensor" in mask_gm.code
    # score_mod's 5 arguments + BIAS; mask_mod's 4 + DOCS: lifted, passed as buffers
    assert len([n for n in score_gm.graph.nodes if n.op == "placeholder"]) == 6
    assert len([n for n in mask_gm.graph.nodes if n.op == "placeholder"]) == 5
    assert len(node.args[7]) == 1 and len(node.args[8]) == 1
    # the BlockMask's tensors are graph inputs; its lengths and block sizes constants
    block = node.args[4]
    assert block[:2] == (L, L) and block[-3:-1] == (8, 8)
    assert all(a.op == "placeholder" for a in block[2:10])


def test_a_rebound_table_is_guarded():
    global BIAS
    bm = create_block_mask(_docs, 1, 2, L, L, device="cpu", BLOCK_SIZE=8)
    backend = CountingBackend()
    compiled = kiln_compile(f, backend=backend, fullgraph=True)
    q, k, v = (torch.randn(1, 2, L, 8) for _ in range(3))
    old = BIAS
    try:
        compiled(q, k, v, bm)
        BIAS = torch.randn(2 * L) * 5
        torch.testing.assert_close(compiled(q, k, v, bm), _eager(f, q, k, v, bm))
    finally:
        BIAS = old


def test_no_score_mod_and_no_block_mask_are_torch_defaults():
    backend = CountingBackend()

    def g(q, k, v):
        return flex_attention(q, k, v, return_lse=True)

    compiled = kiln_compile(g, backend=backend, fullgraph=True)
    q, k, v = (torch.randn(2, 2, L, 8) for _ in range(3))
    out, lse = compiled(q, k, v)
    ref_out, ref_lse = _eager(g, q, k, v)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse, ref_lse)
    assert len(backend.graphs) == 1
