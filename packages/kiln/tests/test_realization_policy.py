"""loopir's realization rules for decoder-LM attention blocks (issue 9, Llama losing to
inductor): each rule is checked for its answer (through the ``kiln`` backend, C++ kernels,
against eager) and for having fired (in the lowered IR), so that a rule that silently stops
applying fails here.

- rotary cos/sin (a costly value several consumers broadcast) computed once, not once per
  head and layer;
- an extern input computed by a loop written in eager's layout, so the transpose after SDPA
  stays a view (no copy kernel between SDPA and the output projection);
- several views of one loop (the normed hidden state under q, k and v projections) realized
  once, not one copy per view.
"""

from __future__ import annotations

import kiln
import kiln_aotgrad
import kiln_loopir as K
import torch
import torch.nn as nn
import torch.nn.functional as F
from kiln_codegen_cpp import compile_fx
from kiln_loopir.ir import ComputedBuffer, ExternKernel, MultiOutput

B, T, H, D = 2, 16, 4, 8
C = H * D


def _rotate_half(x):
    return torch.cat((-x[..., D // 2:], x[..., : D // 2]), dim=-1)


class RotaryAttention(nn.Module):
    """Two Llama-style layers: RMSNorm, separate q/k/v projections, rotary embedding (cos/sin
    computed once from the positions and broadcast over heads), causal SDPA, output
    projection."""

    def __init__(self, layers: int = 2):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D)))
        self.norms = nn.ParameterList([nn.Parameter(torch.rand(C) + 0.5) for _ in range(layers)])
        self.q = nn.ModuleList([nn.Linear(C, C, bias=False) for _ in range(layers)])
        self.k = nn.ModuleList([nn.Linear(C, C, bias=False) for _ in range(layers)])
        self.v = nn.ModuleList([nn.Linear(C, C, bias=False) for _ in range(layers)])
        self.o = nn.ModuleList([nn.Linear(C, C, bias=False) for _ in range(layers)])

    def forward(self, x):
        pos = torch.arange(x.shape[1], dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        for i in range(len(self.q)):
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norms[i]
            q = self.q[i](h).view(B, T, H, D).transpose(1, 2)
            k = self.k[i](h).view(B, T, H, D).transpose(1, 2)
            v = self.v[i](h).view(B, T, H, D).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o[i](o.transpose(1, 2).contiguous().reshape(B, T, C))
        return x


def _model_and_input():
    torch.manual_seed(0)
    return RotaryAttention().eval(), torch.randn(B, T, C)


def _lowered_args(model, args):
    with torch.no_grad():
        return K.lower(kiln_aotgrad.trace_inference(model, list(args)), list(args))


def _lowered(model, x):
    return _lowered_args(model, [x])


def test_matches_eager_through_kiln():
    model, x = _model_and_input()
    with torch.no_grad():
        expected = model(x)
        got = kiln.compile(model)(x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_rotary_cos_and_sin_computed_once():
    """Two layers, q and k each: recomputed, cos would appear in four consumer bodies."""
    graph = _lowered(*_model_and_input())
    text = str(graph)
    assert text.count("ops.cos(") == 1, text
    assert text.count("ops.sin(") == 1, text


#: a linear layer's product: ``mm``, or oneDNN's or MKL's GEMM on the packed weight (CPU float32)
_PRODUCTS = (torch.ops.aten.mm.default, torch.ops.mkl._mkl_linear.default,
             torch.ops.mkldnn._linear_pointwise.default)


def test_sdpa_output_feeds_the_projection_without_a_copy():
    graph = _lowered(*_model_and_input())
    sdpa_outs = {m.name for b in graph.buffers if isinstance(b, ExternKernel)
                 and "scaled_dot_product" in str(b.op) for m in b.outputs
                 if isinstance(m, MultiOutput) and m.index == 0}
    assert len(sdpa_outs) == 2
    mm_inputs = {getattr(a, "name", None) for b in graph.buffers if isinstance(b, ExternKernel)
                 and b.op in _PRODUCTS for a in b.inputs}
    assert sdpa_outs <= mm_inputs  # the o-projection reads SDPA's result as it is
    text = str(graph)
    for name in sdpa_outs:  # and no loop copies it
        assert f"ops.load({name}," not in text, text


def test_views_of_one_norm_share_one_buffer():
    """q, k and v projections of one normed value: one buffer feeds all three matmuls."""
    graph = _lowered(*_model_and_input())
    by_input: dict = {}
    for b in graph.buffers:
        if isinstance(b, ExternKernel) and b.op in _PRODUCTS:
            name = getattr(b.inputs[0], "name", None)
            by_input[name] = by_input.get(name, 0) + 1
    computed = {b.name for b in graph.buffers if isinstance(b, ComputedBuffer)}
    shared = [n for n, k in by_input.items() if n in computed and k == 3]
    assert len(shared) == 2, by_input  # one per layer


def test_weights_written_after_compile_give_the_new_answer():
    model, x = _model_and_input()
    compiled = kiln.compile(model)
    with torch.no_grad():
        compiled(x)
        model.q[0].weight.add_(0.5)
        model.norms[1].mul_(2.0)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


def test_unsqueezed_loop_as_an_extern_input_matches_eager():
    """A mask computed by a loop and unsqueezed into SDPA (Swin's windows): the view of the
    loop is realized through the loop (regression: the unsqueeze's strides were a tuple)."""

    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=(m * 2.0 - 1.0).unsqueeze(1))

    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    m = torch.randn(B, T, T)
    compiled = compile_fx(torch.fx.symbolic_trace(f), [q, k, v, m])  # raises if it cannot
    with torch.no_grad():
        torch.testing.assert_close(compiled(q, k, v, m)[0], f(q, k, v, m), rtol=1e-4, atol=1e-4)


def test_a_slice_of_a_loop_into_an_extern_computes_only_the_slice():
    """Realizing through the loop is for views with all of its elements: ``y[:3] @ w``
    writes the 3 rows it needs, not the whole ``y``."""

    class SliceMatmul(nn.Module):
        def forward(self, x, w):
            return (x.sin() * 2)[:3] @ w

    x, w = torch.randn(64, 16), torch.randn(16, 8)
    graph = _lowered_args(SliceMatmul(), [x, w])
    sizes = [[int(s) for s in b.layout.size] for b in graph.buffers if isinstance(b, ComputedBuffer)]
    assert sizes == [[3, 16]], sizes
    compiled = compile_fx(torch.fx.symbolic_trace(SliceMatmul()), [x, w])
    torch.testing.assert_close(compiled(x, w)[0], SliceMatmul()(x, w), rtol=1e-5, atol=1e-5)
