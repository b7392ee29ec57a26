"""The fused FlexAttention forward kernel (kiln_codegen_triton.flex_attention) under Triton's
interpreter, against eager ``flex_attention`` (torch's own reference on CPU): mask and score
mods inlined (captured tables and constants included), BlockMask sparsity with partial and
full blocks, grouped-query attention, lengths that are not multiples of the block size.

The operator's node and its mod subgraphs come from tracing torch's operator with make_fx,
as aotgrad's trace keeps it where the fused kernel is chosen. Sizes are small: the
interpreter is slow."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from _triton_sm90 import compile_job
from kiln_codegen_triton.flex_attention import FlexAttentionKernel, FlexModError, unsupported_reason
from torch._higher_order_ops.flex_attention import flex_attention as flex_hop
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

D = 8
BLOCK = 16
SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625])
DOCS = torch.tensor([0] * 13 + [1] * 20 + [2] * 7)  # document id per position (length 40)
REL = torch.randn(96, generator=torch.Generator().manual_seed(3))


def _causal(b, h, m, n):
    return m >= n


def _window(b, h, m, n):
    return (m >= n) & (m - n <= 9)


def _docs(b, h, m, n, docs):
    return docs[m] == docs[n]


def _alibi(s, b, h, m, n, slopes):
    return s + slopes[h] * (n - m)


def _rel(s, b, h, m, n, rel):
    return s + rel[m - n + 48]


def _softcap(s, b, h, m, n):
    return 20.0 * torch.tanh(s / 20.0)


def _identity(s, b, h, m, n):
    return s


# name: (score_mod, mask_mod, score tables, mask tables)
PATTERNS = {
    "causal": (_identity, _causal, (), ()),
    "sliding_window": (_identity, _window, (), ()),
    "document_mask": (_identity, _docs, (), (DOCS,)),
    "alibi_causal": (_alibi, _causal, (SLOPES,), ()),
    "relative_bias_table": (_rel, _window, (REL,), ()),
    "softcap_documents": (_softcap, _docs, (), (DOCS,)),
}


def _bound(mod, tables):
    """``mod`` with its tables bound, as user code closes over them (4 or 5 arguments)."""
    if not tables:
        return mod
    if mod.__code__.co_argcount - len(tables) == 4:
        return lambda b, h, m, n: mod(b, h, m, n, *tables)
    return lambda s, b, h, m, n: mod(s, b, h, m, n, *tables)


def _forward_kernel(kernel_class, q, k, v, score_mod, mask_mod, s_tables, m_tables, block_mask,
                    scale, **options):
    """``kernel_class`` (the fused forward or the split-KV decoding kernel) built from
    make_fx's trace of torch's operator; ``options`` go to its constructor."""
    bm = block_mask.as_tuple()

    def f(q, k, v, s_tables, m_tables, *bm_tensors):
        return flex_hop(q, k, v, score_mod, (*bm_tensors, mask_mod), scale, {},
                        tuple(s_tables), tuple(m_tables))

    gm = make_fx(f)(q, k, v, list(s_tables), list(m_tables), *bm[:-1])
    return kernel_class(gm.sdpa_score0, gm.sdpa_mask0, s_tables, m_tables, q.dtype, q.size(-1),
                        v.size(-1), **options)


def _launch_forward(kernel, q, k, v, block_mask, scale, s_tables, m_tables):
    """(out, lse, max) of a forward or decoding kernel over ``block_mask``'s blocks."""
    bm = block_mask.as_tuple()
    return kernel(q, k, v, bm[2], bm[3], bm[4], bm[5], bm[-3], bm[-2], scale, s_tables, m_tables)


def _run(q, k, v, score_mod, mask_mod, s_tables, m_tables, block_mask, scale):
    """The fused kernel built from make_fx's trace of torch's operator, and its results."""
    kernel = _forward_kernel(FlexAttentionKernel, q, k, v, score_mod, mask_mod, s_tables, m_tables,
                             block_mask, scale)
    return kernel, _launch_forward(kernel, q, k, v, block_mask, scale, s_tables, m_tables)


def _eager(q, k, v, score_mod, block_mask, scale, gqa=False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                              enable_gqa=gqa, return_lse=True)


def _inputs(b, hq, hkv, lq, lkv, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, hq, lq, D, generator=g).to(dtype),
            torch.randn(b, hkv, lkv, D, generator=g).to(dtype),
            torch.randn(b, hkv, lkv, D, generator=g).to(dtype))


@pytest.mark.parametrize("name", list(PATTERNS))
def test_patterns_equal_eager(name):
    score_mod, mask_mod, s_tables, m_tables = PATTERNS[name]
    B, H, L = 1, 2, 40  # 40: three blocks of 16, the last partial
    user_mask = _bound(mask_mod, m_tables)
    bm = create_block_mask(user_mask, B, H, L, L, device="cpu", BLOCK_SIZE=BLOCK)
    q, k, v = _inputs(B, H, H, L, L)
    kernel, (out, lse, mx) = _run(q, k, v, score_mod, mask_mod, s_tables, m_tables, bm, 0.35)
    ref_out, ref_lse = _eager(q, k, v, _bound(score_mod, s_tables), bm, 0.35)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse * math.log(2), ref_lse)
    assert "kiln_kernel" in kernel.source


def test_mods_are_inlined_into_the_kernel():
    """The mods' ops appear in the kernel itself: the softcap's tanh, the table gathers."""
    B, H, L = 1, 2, 16
    bm = create_block_mask(_bound(_docs, (DOCS[:L],)), B, H, L, L, device="cpu", BLOCK_SIZE=BLOCK)
    q, k, v = _inputs(B, H, H, L, L)
    kernel, _ = _run(q, k, v, lambda s, b, h, m, n, slopes: 20.0 * torch.tanh(s / 20.0) + slopes[h],
                     _docs, (SLOPES[:H],), (DOCS[:L],), bm, 1.0)
    src = kernel.source
    assert "kmath.tanh(" in src and "tl.load(ST0 + (" in src and "tl.load(MT0 + (" in src
    # slopes[h] is one load per program (the head is the program's), documents[m] and
    # documents[n] one vector each along the tile's query and key sides, not tile gathers
    slope_load = next(ln for ln in src.splitlines() if "tl.load(ST0 + (" in ln)
    doc_loads = [ln for ln in src.splitlines() if "tl.load(MT0 + (" in ln]
    assert "tile0" not in slope_load and "tile0" not in "".join(doc_loads)
    assert any("q_idx < L" in ln for ln in doc_loads) and any("kv_idx < S" in ln for ln in doc_loads)
    assert src.count("tl.dot(") == 4  # q k^T and p v, each with and without IEEE precision


def test_grouped_query_attention_and_unequal_odd_lengths():
    """4 query heads over 2 kv heads, 2 batches, query length 23 and kv length 37 (neither a
    multiple of the block size): causal from the end, with an ALiBi score_mod."""
    B, HQ, HKV, LQ, LKV = 2, 4, 2, 23, 37

    def mask(b, h, m, n):
        return m + (LKV - LQ) >= n

    bm = create_block_mask(mask, B, HQ, LQ, LKV, device="cpu", BLOCK_SIZE=BLOCK)
    q, k, v = _inputs(B, HQ, HKV, LQ, LKV, seed=1)
    _, (out, lse, _) = _run(q, k, v, _alibi, mask, (SLOPES,), (), bm, 0.5)
    ref_out, ref_lse = _eager(q, k, v, _bound(_alibi, (SLOPES,)), bm, 0.5, gqa=True)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse * math.log(2), ref_lse)


def test_fully_masked_rows_are_zero_with_minus_inf_lse():
    """Rows whose every score is masked: output zeros and logsumexp -inf, as the operator."""
    B, H, L = 1, 1, 24

    def mask(b, h, m, n):
        return (m >= 8) & (n <= m)

    bm = create_block_mask(mask, B, H, L, L, device="cpu", BLOCK_SIZE=8)
    q, k, v = _inputs(B, H, H, L, L, seed=2)
    _, (out, lse, _) = _run(q, k, v, _identity, mask, (), (), bm, 1.0)
    ref_out, ref_lse = _eager(q, k, v, None, bm, 1.0)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse * math.log(2), ref_lse)
    assert torch.isneginf(lse[..., :8]).all() and (out[..., :8, :] == 0).all()


def test_only_the_block_masks_blocks_are_visited():
    """A BlockMask whose block lists omit a block that mask_mod keeps: the kernel skips it
    (the block lists decide what is read, as in torch's kernels), so its result differs from
    one that visits every block."""
    B, H, L = 1, 1, 32

    def everything(b, h, m, n):
        return m >= 0

    full = create_block_mask(everything, B, H, L, L, device="cpu", BLOCK_SIZE=BLOCK)
    causal = create_block_mask(_causal, B, H, L, L, device="cpu", BLOCK_SIZE=BLOCK)
    # causal's block lists with the all-true mask_mod: only the listed blocks count
    q, k, v = _inputs(B, H, H, L, L, seed=4)
    _, (skipping, _, _) = _run(q, k, v, _identity, everything, (), (), causal, 1.0)
    _, (dense, _, _) = _run(q, k, v, _identity, everything, (), (), full, 1.0)
    ref_out, _ = _eager(q, k, v, None, full, 1.0)
    torch.testing.assert_close(dense, ref_out)
    # rows of the first block see only keys 0..15 (block (0, 1) is not listed)
    ref_first, _ = _eager(q[:, :, :16], k[:, :, :16], v[:, :, :16], None,
                          create_block_mask(everything, B, H, 16, 16, device="cpu",
                                            BLOCK_SIZE=BLOCK), 1.0)
    torch.testing.assert_close(skipping[:, :, :16], ref_first)
    assert not torch.allclose(skipping, dense)


def test_half_precision_inputs():
    B, H, L = 1, 2, 32
    bm = create_block_mask(_causal, B, H, L, L, device="cpu", BLOCK_SIZE=BLOCK)
    q, k, v = _inputs(B, H, H, L, L, dtype=torch.float16, seed=5)
    _, (out, _, _) = _run(q, k, v, _softcap, _causal, (), (), bm, 0.35)
    ref_out, _ = _eager(q.float(), k.float(), v.float(), _softcap, bm, 0.35)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), ref_out, atol=2e-3, rtol=2e-3)


def test_a_mod_with_a_reduction_is_refused():
    """A mod that is not a per-element value (a sum over a table) cannot be inlined."""
    B, H, L = 1, 1, 16
    bm = create_block_mask(_causal, B, H, L, L, device="cpu", BLOCK_SIZE=BLOCK)
    q, k, v = _inputs(B, H, H, L, L)
    with pytest.raises(FlexModError):
        _run(q, k, v, lambda s, b, h, m, n, t: s + t.sum(), _causal, (REL,), (), bm, 1.0)


def test_unsupported_inputs_are_named():
    q = torch.randn(1, 2, 16, 8)
    assert unsupported_reason(q, q, q, (16, 16), interpret=True) is None
    assert "dtype" in unsupported_reason(q.double(), q.double(), q.double(), (16, 16), True)
    assert "head dim" in unsupported_reason(q, q, q, (128, 128), interpret=False)
    assert "heads" in unsupported_reason(torch.randn(1, 3, 16, 8), q, q, (16, 16), True)


#: compiles the named kernels of the module (_triton_sm90.PRELUDE), for their PTX
_COMPILE_SM90 = """
consts, ptrs = job["consts"], job["ptrs"]
ptx = []
for name in job["kernels"]:
    fn = getattr(module, name)
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n == "SCALE" else "i32")
           for n in fn.arg_names}
    compiled = triton.compile(triton.compiler.ASTSource(fn, sig, consts, pointer_attrs(sig)),
                              target=SM90, options=job["options"])
    ptx.append(compiled.asm["ptx"])
print(json.dumps({"ptx": ptx}))
"""


def _compile_sm90(path: str, kernels: list[str], ptrs: dict, consts: dict, options: dict) -> list:
    return compile_job(_COMPILE_SM90, {"path": path, "kernels": kernels, "ptrs": ptrs,
                                       "consts": consts, "options": options})["ptx"]


def test_the_kernel_compiles_for_sm90_with_tensor_cores():
    """The GPU build of the kernel (libdevice math, bf16, D 64, 128 x 64 tiles) compiles for
    an H100/H200 (sm_90) down to a cubin, its two dots on warp-group MMA instructions."""
    B, H, L = 1, 2, 256
    bm = create_block_mask(_causal, B, H, L, L, device="cpu", BLOCK_SIZE=128)
    q = torch.randn(B, H, L, 64, dtype=torch.bfloat16)
    kernel = _forward_kernel(FlexAttentionKernel, q, q, q, _alibi, _causal, (SLOPES[:H],), (), bm,
                             0.125, interpret=False)
    assert "libdevice as kmath" in kernel.source
    ptrs = {**dict.fromkeys(("Q", "K", "V", "OUT"), "*bf16"), "LSE": "*fp32", "MAXS": "*fp32",
            **dict.fromkeys(("KV_NUM", "KV_IDX", "FULL_NUM", "FULL_IDX"), "*i32"), "ST0": "*fp32"}
    consts = {"D": 64, "DV": 64, "BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_D": 64, "BLOCK_DV": 64,
              "HAS_FULL": True, "IEEE": False}
    (ptx,) = _compile_sm90(kernel.path, ["kiln_kernel"], ptrs, consts,
                           {"num_warps": 4, "num_stages": 3})
    assert "wgmma" in ptx


# ------------------------------------------------------------------------------- backward


def _run_backward(q, k, v, score_mod, mask_mod, s_tables, m_tables, block_mask, scale, seed=0):
    """The fused forward and backward kernels built from make_fx's trace of torch's operator
    and its autograd rule (the joint graph of score_mod as a subgraph), and (dq, dk, dv),
    against torch's operator run eagerly with its autograd rule."""
    from kiln_codegen_triton.flex_attention import FlexAttentionBackwardKernel

    bm = block_mask.as_tuple()
    grad = torch.randn(*q.shape[:3], v.size(-1), generator=torch.Generator().manual_seed(seed))

    def f(q, k, v, s_tables, m_tables, *bm_tensors):
        out = flex_hop(q, k, v, score_mod, (*bm_tensors, mask_mod), scale, {}, tuple(s_tables),
                       tuple(m_tables))[0]
        return [out, *torch.autograd.grad(out, (q, k, v), grad)]

    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    gm = make_fx(f)(qg, kg, vg, list(s_tables), list(m_tables), *bm[:-1])
    want = f(qg, kg, vg, list(s_tables), list(m_tables), *bm[:-1])
    forward = FlexAttentionKernel(gm.sdpa_score0, gm.sdpa_mask0, s_tables, m_tables, q.dtype,
                                  q.size(-1), v.size(-1))
    out, lse, _ = _launch_forward(forward, q, k, v, block_mask, scale, s_tables, m_tables)
    backward = FlexAttentionBackwardKernel(gm.fw_graph0, gm.joint_graph0, gm.mask_graph0, s_tables,
                                           m_tables, q.dtype, q.size(-1), v.size(-1))
    got = backward(q, k, v, out, lse, grad, None, *bm[2:10], bm[-3], bm[-2], scale, s_tables,
                   m_tables)
    return backward, [out, *got], want


@pytest.mark.parametrize("name", ["sliding_window", "softcap_documents", "relative_bias_table"])
def test_backward_patterns_equal_torch_autograd(name):
    score_mod, mask_mod, s_tables, m_tables = PATTERNS[name]
    B, H, L = 1, 2, 40
    bm = create_block_mask(_bound(mask_mod, m_tables), B, H, L, L, device="cpu", BLOCK_SIZE=BLOCK)
    q, k, v = _inputs(B, H, H, L, L, seed=6)
    kernel, got, want = _run_backward(q, k, v, score_mod, mask_mod, s_tables, m_tables, bm, 0.35)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert "kiln_kernel_dq" in kernel.source


def test_backward_grouped_query_attention_and_unequal_odd_lengths():
    """dk and dv of a kv head sum over its 4 / 2 query heads; lengths 23 and 37."""
    B, HQ, HKV, LQ, LKV = 2, 4, 2, 23, 37

    def mask(b, h, m, n):
        return m + (LKV - LQ) >= n

    bm = create_block_mask(mask, B, HQ, LQ, LKV, device="cpu", BLOCK_SIZE=BLOCK)
    q, k, v = _inputs(B, HQ, HKV, LQ, LKV, seed=7)
    _, got, want = _run_backward(q, k, v, _alibi, mask, (SLOPES,), (), bm, 0.5)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_the_backward_kernels_compile_for_sm90_with_tensor_cores():
    """Both backward kernels' GPU builds (bf16, D 64, a soft-capping score_mod whose joint
    graph holds tanh's derivative) compile for sm_90 on warp-group MMA instructions."""
    from kiln_codegen_triton.flex_attention import FlexAttentionBackwardKernel, gpu_bwd_tiles

    B, H, L = 1, 2, 256
    bm = create_block_mask(_causal, B, H, L, L, device="cpu", BLOCK_SIZE=128)

    def f(q, k, v, *bm_tensors):
        out = flex_hop(q, k, v, _softcap, (*bm_tensors, _causal), 0.125, {}, (), ())[0]
        return torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

    q, k, v = (torch.randn(B, H, L, 64).requires_grad_() for _ in range(3))
    gm = make_fx(f)(q, k, v, *bm.as_tuple()[:-1])
    kernel = FlexAttentionBackwardKernel(gm.fw_graph0, gm.joint_graph0, gm.mask_graph0, (), (),
                                         torch.bfloat16, 64, 64, interpret=False)
    block_m, block_n, warps, stages = gpu_bwd_tiles(torch.bfloat16, 64)
    ptrs = {**dict.fromkeys(("Q", "K", "V", "DO", "DQ", "DK", "DV_"), "*bf16"),
            "LSE": "*fp32", "DELTA": "*fp32",
            **dict.fromkeys(("KV_NUM", "KV_IDX", "Q_NUM", "Q_IDX", "FULL_NUM", "FULL_IDX"), "*i32")}
    consts = {"D": 64, "DV": 64, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_D": 64,
              "BLOCK_DV": 64, "HAS_FULL": True, "IEEE": False}
    ptx = _compile_sm90(kernel.path, ["kiln_kernel", "kiln_kernel_dq"], ptrs, consts,
                        {"num_warps": warps, "num_stages": stages})
    assert all("wgmma" in p for p in ptx)


def test_a_tensor_the_mod_holds_as_a_constant_is_a_kernel_argument():
    """A mod closing over a tensor it is not given as a buffer: the traced subgraph holds it
    as a constant, which the kernel reads through a pointer argument of its own."""
    B, H, L = 1, 2, 40
    bm = create_block_mask(_bound(_docs, (DOCS,)), B, H, L, L, device="cpu", BLOCK_SIZE=BLOCK)
    q, k, v = _inputs(B, H, H, L, L, seed=8)
    kernel, (out, _, _) = _run(q, k, v, _identity, lambda b, h, m, n: DOCS[m] == DOCS[n], (), (),
                               bm, 0.5)
    assert list(kernel.constants) and "tl.load(mmC0 + (" in kernel.source
    ref_out, _ = _eager(q, k, v, None, bm, 0.5)
    torch.testing.assert_close(out, ref_out)


# ------------------------------------------------------------------------------- decoding

CACHE = 150  # keys: nine blocks of 16 and a partial one
DECODE_DOCS = torch.tensor([0] * 40 + [1] * 70 + [2] * 40)  # document id per key


def _decode_causal(b, h, m, n):  # the query rows are the cache's last positions
    return n <= CACHE - 3 + m


def _decode_window(b, h, m, n):
    return (n <= CACHE - 3 + m) & (CACHE - 3 + m - n <= 40)


def _decode_docs(b, h, m, n, docs):
    return (docs[n] == 1) | (n < m)


def _decode_rel(s, b, h, m, n, rel):
    return s + rel[(n - m) % 96]


def _everything(b, h, m, n):
    return n >= 0


# name: (score_mod, mask_mod, score tables, mask tables)
DECODE_PATTERNS = {
    "no_mask": (_identity, _everything, (), ()),
    "causal_alibi": (_alibi, _decode_causal, (SLOPES[:2],), ()),
    "window_softcap": (_softcap, _decode_window, (), ()),
    "documents_relative_bias": (_decode_rel, _decode_docs, (REL,), (DECODE_DOCS,)),
}


def _run_decode(q, k, v, score_mod, mask_mod, s_tables, m_tables, block_mask, scale, splits):
    from kiln_codegen_triton.flex_decoding import FlexDecodingKernel

    kernel = _forward_kernel(FlexDecodingKernel, q, k, v, score_mod, mask_mod, s_tables, m_tables,
                             block_mask, scale)
    kernel.splits = splits
    return kernel, _launch_forward(kernel, q, k, v, block_mask, scale, s_tables, m_tables)


@pytest.mark.parametrize("splits", [1, 3, None])
@pytest.mark.parametrize("lq", [1, 3])
@pytest.mark.parametrize("name", list(DECODE_PATTERNS))
def test_decoding_patterns_equal_eager(name, lq, splits):
    """The split-KV decoding kernel (one share finishing its rows; three shares and the
    combine; the default count) against eager flex_attention, one and three query rows
    over a 150-key cache, with mods reading captured tables."""
    score_mod, mask_mod, s_tables, m_tables = DECODE_PATTERNS[name]
    B, H = 2, 2
    bm = create_block_mask(_bound(mask_mod, m_tables), B, H, lq, CACHE, device="cpu",
                           BLOCK_SIZE=BLOCK)
    q, k, v = _inputs(B, H, H, lq, CACHE, seed=11)
    kernel, (out, lse, _) = _run_decode(q, k, v, score_mod, mask_mod, s_tables, m_tables, bm,
                                        0.4, splits)
    ref_out, ref_lse = _eager(q, k, v, _bound(score_mod, s_tables), bm, 0.4)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse * math.log(2), ref_lse)
    assert "kiln_kernel_decode" in kernel.source


def test_decoding_more_shares_than_tiles_and_masked_rows():
    """Shares with no tiles (7 shares of a 3-block row) contribute nothing; a row every key
    of which is masked is zeros with a -inf logsumexp, as the forward kernel's."""
    B, H, LQ, S = 1, 2, 2, 40

    def mask(b, h, m, n):
        return (m == 0) & (n < 30)

    bm = create_block_mask(mask, B, H, LQ, S, device="cpu", BLOCK_SIZE=BLOCK)
    q, k, v = _inputs(B, H, H, LQ, S, seed=12)
    _, (out, lse, _) = _run_decode(q, k, v, _identity, mask, (), (), bm, 0.5, 7)
    ref_out, ref_lse = _eager(q, k, v, None, bm, 0.5)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse * math.log(2), ref_lse)
    assert torch.all(out[:, :, 1] == 0) and torch.all(torch.isneginf(lse[:, :, 1]))


def test_decoding_grouped_query_attention_half_precision():
    """4 query heads on 2 kv heads, float16, one query row (bfloat16 is the GPU case, but
    this Triton's interpreter computes bfloat16 wrongly even for ``x * 2``)."""
    B, HQ, HKV, S = 2, 4, 2, 70
    bm = create_block_mask(_everything, B, HQ, 1, S, device="cpu", BLOCK_SIZE=BLOCK)
    q, k, v = _inputs(B, HQ, HKV, 1, S, dtype=torch.float16, seed=13)
    _, (out, _, _) = _run_decode(q, k, v, _alibi, _everything, (SLOPES,), (), bm, 0.3, None)
    ref_out, _ = _eager(q, k, v, _bound(_alibi, (SLOPES,)), bm, 0.3, gqa=True)
    torch.testing.assert_close(out, ref_out, atol=2e-2, rtol=2e-2)


def test_split_count_is_two_programs_per_sm():
    from kiln_codegen_triton.flex_decoding import split_count

    assert split_count(programs=32 * 16, tiles=128, sms=132) == 1  # B32 H16: enough programs
    assert split_count(programs=8, tiles=128, sms=132) == 33
    assert split_count(programs=2, tiles=3, sms=132) == 3  # never more shares than tiles


def test_the_decoding_kernels_compile_for_sm90():
    """The GPU build of the decoding kernel (bf16, D 64, 16 x 64 tiles, split and direct)
    and of its combine compile for sm_90 with tensor-core dots."""
    from kiln_codegen_triton.flex_decoding import FlexDecodingKernel, decode_tiles

    B, H, S = 1, 2, 256
    bm = create_block_mask(_causal, B, H, 1, S, device="cpu", BLOCK_SIZE=128)
    q = torch.randn(B, H, 1, 64, dtype=torch.bfloat16)
    k = torch.randn(B, H, S, 64, dtype=torch.bfloat16)
    kernel = _forward_kernel(FlexDecodingKernel, q, k, k, _alibi, _causal, (SLOPES[:H],), (), bm,
                             0.125, interpret=False)
    block_n, warps, stages = decode_tiles(torch.bfloat16, 64)
    ptrs = {**dict.fromkeys(("Q", "K", "V", "OUT"), "*bf16"),
            **dict.fromkeys(("LSE", "MAXS", "M_PART", "L_PART", "ACC_PART", "ST0"), "*fp32"),
            **dict.fromkeys(("KV_NUM", "KV_IDX", "FULL_NUM", "FULL_IDX"), "*i32")}
    tiles = {"D": 64, "DV": 64, "BLOCK_M": 16, "BLOCK_N": block_n, "BLOCK_D": 64, "BLOCK_DV": 64,
             "HAS_FULL": True, "IEEE": False}
    options = {"num_warps": warps, "num_stages": stages}
    for direct in (True, False):
        (ptx,) = _compile_sm90(kernel.path, ["kiln_kernel_decode"], ptrs,
                               {**tiles, "DIRECT": direct}, options)
        assert "mma" in ptx
    _compile_sm90(kernel.path, ["kiln_kernel_combine"], ptrs,
                  {"DV": 64, "BLOCK_M": 16, "BLOCK_DV": 64}, options)
