"""CORE_OPS: the ATen ops an aotgrad graph may contain (docs/ops.md is generated from this).

The set is torch's Core ATen IR (ops tagged ``torch.Tag.core``, functional overloads only)
minus what kiln's decomposition table rewrites (softmax, the norms, var, gelu, ...: see
``kiln_aotgrad.decompositions``), plus four kinds of extra: the input-mutation write-back
``copy_``, the size queries of symbolic graphs, the fused attention kernels kept whole as
extern-call candidates, and var/var_mean/std, which the table keeps whole on CUDA only.

Besides these ``call_function`` targets a graph may hold ``operator.getitem`` (picking an
output of a multi-output op) and SymInt arithmetic (``operator.mul``, ``operator.floordiv``,
``torch.sym_max``, ...) on the sizes of symbolic inputs.

A test checks that every op tagged ``core`` by this torch is either here or decomposed, and
that nothing here is decomposed.
"""

from __future__ import annotations

import torch

__all__ = ["CORE_OP_GROUPS", "CORE_OPS", "DEVICE_KEPT_OPS", "is_core_op"]

# fmt: off
# group title -> (what loopir is expected to do with them, op names "packet.overload")
CORE_OP_GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "pointwise, unary": (
        "Pointwise lowering.",
        (
            "abs.default", "acos.default", "acosh.default", "asin.default", "asinh.default",
            "atan.default", "atanh.default", "bitwise_not.default", "ceil.default",
            "cos.default", "cosh.default", "erf.default", "exp.default", "expm1.default",
            "floor.default", "isinf.default", "isnan.default", "log.default", "log10.default",
            "log1p.default", "log2.default", "logical_not.default", "neg.default",
            "reciprocal.default", "relu.default", "round.default", "rsqrt.default",
            "sigmoid.default", "sign.default", "sin.default", "sinh.default", "sqrt.default",
            "tan.default", "tanh.default", "trunc.default",
        ),
    ),
    "pointwise, binary and ternary": (
        "Pointwise lowering (with broadcasting and type promotion).",
        (
            "add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar", "mul.Tensor", "mul.Scalar",
            "div.Tensor", "div.Scalar", "div.Tensor_mode", "div.Scalar_mode",
            "remainder.Tensor", "remainder.Scalar", "fmod.Tensor", "fmod.Scalar",
            "pow.Tensor_Tensor", "pow.Tensor_Scalar", "pow.Scalar", "atan2.default",
            "maximum.default", "minimum.default", "clamp.default", "clamp.Tensor",
            "eq.Tensor", "eq.Scalar", "ne.Tensor", "ne.Scalar", "lt.Tensor", "lt.Scalar",
            "le.Tensor", "le.Scalar", "gt.Tensor", "gt.Scalar", "ge.Tensor", "ge.Scalar",
            "logical_and.default", "logical_or.default", "logical_xor.default",
            "bitwise_and.Tensor", "bitwise_and.Scalar", "bitwise_or.Tensor",
            "bitwise_or.Scalar", "bitwise_xor.Tensor", "bitwise_xor.Scalar", "where.self",
        ),
    ),
    "reductions": (
        "Reduction lowering.",
        (
            "sum.dim_IntList", "mean.default", "mean.dim", "prod.default", "prod.dim_int",
            "amax.default", "amin.default", "max.dim", "min.dim", "argmax.default",
            "argmin.default", "any.default", "any.dim", "any.dims", "cumsum.default",
        ),
    ),
    "views and layout": (
        "Index arithmetic (no copy); clone/_to_copy/copy are pointwise copies.",
        (
            "view.default", "permute.default", "expand.default", "slice.Tensor", "select.int",
            "squeeze.dims", "unsqueeze.default", "diagonal.default", "alias.default",
            "as_strided.default", "clone.default", "_to_copy.default", "copy.default",
            "split_with_sizes.default",
        ),
    ),
    "creation": (
        "Pointwise lowering of an index expression or a constant.",
        (
            "full.default", "full_like.default", "scalar_tensor.default",
            "arange.start_step", "empty.memory_format", "empty_strided.default",
        ),
    ),
    "data movement and indexing": (
        "Pointwise lowering with indirect loads, or the aten fallback.",
        (
            "cat.default", "constant_pad_nd.default", "flip.default", "repeat.default",
            "gather.default", "index.Tensor", "index_select.default", "embedding.default",
            "slice_scatter.default", "scatter.value", "scatter.src", "scatter_add.default",
            "scatter_reduce.two", "index_put.default", "masked_scatter.default",
        ),
    ),
    "extern candidates": (
        "Kept whole: extern calls (library kernels) in every codegen.",
        (
            "mm.default", "bmm.default", "addmm.default", "convolution.default",
            "_scaled_dot_product_flash_attention_for_cpu.default",
            "_scaled_dot_product_flash_attention.default",
            "_scaled_dot_product_efficient_attention.default",
            "_scaled_dot_product_cudnn_attention.default",
        ),
    ),
    "windows, pooling, sampling, misc": (
        "Lowered where loopir has a rule, otherwise the aten fallback.",
        (
            "avg_pool2d.default", "avg_pool3d.default", "max_pool2d_with_indices.default",
            "max_pool3d_with_indices.default", "_adaptive_avg_pool2d.default",
            "_adaptive_avg_pool3d.default", "upsample_bilinear2d.vec",
            "upsample_nearest2d.vec", "grid_sampler_2d.default", "_cdist_forward.default",
            "_pdist_forward.default", "_embedding_bag.default", "_fft_r2c.default",
            "_fft_c2r.default", "sort.default", "topk.default", "nonzero.default",
            "_local_scalar_dense.default",
        ),
    ),
    "random": (
        "rand, randn, dropout: philox random numbers in generated kernels where the codegen "
        "has them (Triton); randperm, and all of them on CPU: the aten fallback (eager's "
        "generator). Never recomputed in a backward.",
        ("rand.default", "randn.default", "randperm.default", "native_dropout.default"),
    ),
    "backward ops": (
        "Only in joint (training) graphs; the aten fallback.",
        (
            "convolution_backward.default", "avg_pool2d_backward.default",
            "max_pool2d_with_indices_backward.default",
            "_adaptive_avg_pool2d_backward.default",
        ),
    ),
    "embedding backward on CPU": (
        "Kept whole on CPU (`decompositions._embedding_dense_backward`): an extern call to "
        "eager's kernel. On other devices torch's decomposition (an accumulating index_put).",
        ("embedding_dense_backward.default",),
    ),
    "variance on CUDA": (
        "Kept whole on CUDA (`decompositions.welford_in_loopir`): one Welford pass in loopir. "
        "On CPU the decomposition table rewrites them into two sums.",
        ("var.correction", "var_mean.correction", "std.correction"),
    ),
    "sizes of symbolic inputs": (
        "Size queries in graphs over dynamic sizes; loopir reads them as symbols s0, s1, ...",
        ("sym_size.int", "sym_stride.int", "sym_numel.default", "sym_storage_offset.default"),
    ),
    "input mutation write-back": (
        "copy_(input, new_value) at the end of the graph for each input the program mutated.",
        ("copy_.default",),
    ),
}
# fmt: on


def _resolve(name: str):
    packet, _, overload = name.partition(".")
    pkt = getattr(torch.ops.aten, packet, None)
    return None if pkt is None else getattr(pkt, overload, None)


def _build() -> frozenset:
    ops = set()
    for _, names in CORE_OP_GROUPS.values():
        for name in names:
            op = _resolve(name)
            if op is not None:  # an op this torch build lacks is simply absent
                ops.add(op)
    return frozenset(ops)


CORE_OPS: frozenset = _build()

#: core ops that the decomposition table rewrites on some devices and keeps on others
DEVICE_KEPT_OPS: frozenset = frozenset(
    op
    for group in ("variance on CUDA", "embedding backward on CPU")
    for op in (_resolve(n) for n in CORE_OP_GROUPS[group][1])
    if op is not None
)


def is_core_op(target) -> bool:
    return target in CORE_OPS
