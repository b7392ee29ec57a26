"""Ops that are extern calls by design (library kernels): matmul family, convolution,
attention (SDPA and nn.MultiheadAttention / nn.TransformerEncoderLayer's fused eval paths).
They are ``ExternKernel``s with ``fallback=False`` (not counted as fallbacks)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx

from ..derived_constants import derived_constant
from ..ir.values import Buffer, ConstantBuffer, GenericView, Layout, Pointwise, ReinterpretView
from ..lowering import aten_ops, current, lowering, make_extern, meta_val, realize
from ..sizevars import sympify
from ..virtualized import ops

aten = torch.ops.aten

EXTERN_OPS = aten_ops(
    "bmm.default", "baddbmm.default", "addbmm.default",
    "_convolution.default", "matmul.default",
    "_scaled_dot_product_flash_attention_for_cpu.default",
    "_scaled_dot_product_flash_attention.default",
    "_scaled_dot_product_efficient_attention.default",
    "_scaled_dot_product_cudnn_attention.default",
    # their backwards, for training graphs (cuDNN/flash/memory-efficient kernels)
    "_scaled_dot_product_flash_attention_for_cpu_backward.default",
    "_scaled_dot_product_flash_attention_backward.default",
    "_scaled_dot_product_efficient_attention_backward.default",
    "_scaled_dot_product_cudnn_attention_backward.default",
    "_flash_attention_backward.default", "_efficient_attention_backward.default",
    # kept whole on CPU by aotgrad (a scatter of one atomic add per element is slower)
    "embedding_dense_backward.default",
    "scaled_dot_product_attention.default", "_native_multi_head_attention.default",
    "_transformer_encoder_layer_fwd.default",
    "_weight_int8pack_mm.default", "dot.default", "mv.default", "addmv.default",
    # float8 matmul with scales (float8 training's GEMM)
    "_scaled_mm.default")


def _make(op):
    def lower_fn(*args, **kwargs):
        return make_extern(op, args, kwargs, meta_val(), fallback=False)

    return lower_fn


for _op in EXTERN_OPS:
    lowering(_op)(_make(_op))


# --------------------------------------------------------------------------------------------
# convolution: channels-last where the device's conv library is fastest with it
# --------------------------------------------------------------------------------------------


def channels_last_strides(size) -> list:
    """Strides of an NCHW-sized tensor stored NHWC."""
    _, c, h, w = (sympify(s) for s in size)
    return [c * h * w, sympify(1), w * c, c]


@dataclass(frozen=True)
class DeviceLibrary:
    """What the device's convolution and matrix libraries do well: the one place kiln knows it.

    - ``channels_last``: dtypes whose 2-d convolutions run channels-last (activations and
      weights NHWC). CPU float32: oneDNN (resnet18: ~25% less time than NCHW). CUDA: cuDNN's
      tensor-core kernels (TF32 for float32, as ``torch.backends.cudnn.allow_tf32`` allows by
      default) are NHWC; an NCHW input is transposed around each conv (H200, resnet18 at
      batch 1: 32 transposes, 28% of the GPU time), as torch.compile's layout optimization
      also avoids.
    - ``conv_fused_bias``: the library adds the bias inside the convolution (oneDNN). aten's
      cuDNN path adds it in a separate kernel after the conv, so on CUDA the bias goes to the
      consumer's kernel instead (same rounding: the conv's result is stored, then added to).
    - ``conv_1x1_as_mm``: a 1x1 convolution may run as ``mm`` (``conv_as_matmul``). Not on
      CUDA: cuBLAS float32 is not TF32 by default while cuDNN's is, so the numerics would
      change.
    - ``addmm_bias_in_consumer``: ``addmm``'s bias goes to the consumer's kernel
      (``_bias_in_epilogue``). On CPU addmm first copies the bias into the output (one more
      pass). On CUDA too: keeping ``addmm`` there (cuBLASLt's bias epilogue) was measured
      slower (H200, GPT-2 at batch 1: 2.29 ms of GPU time against 1.45 ms, cuBLASLt picking
      unvectorized SIMT kernels for 24 of its GEMMs), as torch.compile also finds.
    - ``addmm_bias_always_apart``: the bias is added apart even when the product's consumer
      is not elementwise (a view into attention: the add is then a small kernel of its own).
      CUDA: cuBLASLt's bias epilogue picked large-K SIMT kernels for BERT-small's q/k/v
      projections at batch 1 (12 GEMMs, 0.19 ms) where ``mm`` gets tensor-op ones (0.07 ms).
    - ``packed_gemms``: names in ``PACKED_GEMMS``, first choice first: a float32 product with
      a constant weight (``x @ W.t()``: linear layers and 1x1 convolutions in inference) runs
      on the weight packed once at compile time for the first available one
      (``packed_linear``); none: ``mm``/``addmm``. CPU: oneDNN's packed linear, then MKL's
      packed sgemm (``PACKED_GEMMS`` says why); the packed copy costs about the weight's
      memory again.
    - ``gemm_out_align``: dtype -> the multiple a GEMM output's row length should be.
      cuBLAS on an H200 runs bf16/fp16 GEMMs whose output leading dimension is not a multiple
      of 8 on slow kernels (GPT-2's LM head, 50257 columns: eager 12.8 ms a call against
      torch.compile's 2.7 ms, which pads). A constant weight is padded once at compile time
      (``padded_output_matmul``) and the product read back through a view.
    """

    channels_last: tuple
    available: Callable[[], bool]
    conv_fused_bias: bool
    conv_1x1_as_mm: bool
    addmm_bias_in_consumer: bool
    addmm_bias_always_apart: bool = False
    packed_gemms: tuple[str, ...] = ()
    gemm_out_align: dict = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class PackedGemm:
    """A library GEMM ``x @ W.t() (+ bias)`` on a weight packed once at compile time.

    - ``derivation``: the ``derived_constants`` recipe packing ``W`` (``(W, rows[, True])``,
      ``True``: ``W`` is stored ``[in, out]``);
    - ``call(x, packed, W, bias, rows)``: the op and its arguments (``W``: the weight itself,
      ``[out, in]``, for a library that falls back to it);
    - ``worth(rows, k, n)``: whether it beats the next choice on a ``[rows, k] @ [k, n]``
      product (measured per shape; where it does not, the next one of the device's list is
      asked, and ``mm`` runs when none is);
    - ``available()``: the library is in this build of torch."""

    derivation: str
    call: Callable[..., tuple]
    worth: Callable[[int, int, int], bool]
    available: Callable[[], bool]


#: name -> PackedGemm (``register_packed_gemm``); a device library lists the ones it uses
PACKED_GEMMS: dict[str, PackedGemm] = {}


def register_packed_gemm(name: str, gemm: PackedGemm) -> None:
    if name in PACKED_GEMMS:
        raise ValueError(f"packed GEMM {name!r} is already registered")
    PACKED_GEMMS[name] = gemm


def packed_gemm(lib: DeviceLibrary, shape: tuple[int, int, int] | None = None) -> PackedGemm | None:
    """The first of ``lib.packed_gemms`` this torch has and, given a product's ``(rows, k,
    n)``, that is ``worth`` it there (an unknown name fails with the known ones)."""
    for name in lib.packed_gemms:
        gemm = PACKED_GEMMS.get(name)
        if gemm is None:
            raise KeyError(f"no packed GEMM {name!r}; known: {', '.join(sorted(PACKED_GEMMS))}")
        if gemm.available() and (shape is None or gemm.worth(*shape)):
            return gemm
    return None


#: oneDNN's packed linear is the CPU's choice for a product of at least this many flops
#: (2*rows*k*n) or with a weight of at least ``ONEDNN_MIN_WEIGHT`` elements
ONEDNN_MIN_FLOPS = 16e6
ONEDNN_MIN_WEIGHT = 1 << 18


def _onednn_worth(rows: int, k: int, n: int) -> bool:
    """oneDNN's call costs ~12 us more than MKL's or ``mm``'s (1 thread): below ~16 Mflop it
    loses (1.1-1.4x the time: MobileNet's squeeze-excite and narrow pointwise products, 3-13
    Mflop), unless the weight is large (1 MiB and up: a few-row product is a pass over the
    weight, which oneDNN's blocked layout reads faster, 0.5-0.8x: classifier heads)."""
    return 2 * rows * k * n >= ONEDNN_MIN_FLOPS or k * n >= ONEDNN_MIN_WEIGHT


# oneDNN's packed linear (what torch.compile's freezing emits for a linear with a fused
# activation): 0.75-0.95 of MKL's packed sgemm's time on the linear and 1x1-convolution
# shapes of benchmarks/cpu.py's models above 16 Mflop, at 1 thread (thread CPU time;
# experiments/cpu-linear/packed_vs_addmm.py); the transformer models 12-20% faster end to
# end. Not equal to the bit to addmm (another summation order).
register_packed_gemm("onednn", PackedGemm(
    "onednn_packed_linear",
    lambda x, packed, w, bias, rows: (torch.ops.mkldnn._linear_pointwise.default,
                                      [x, packed, bias, "none", [], ""]),
    worth=_onednn_worth,
    available=lambda: torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")))
# MKL's packed sgemm: 0.80-0.97 of addmm's time on BERT/ViT shapes at 2 threads, results
# equal to the bit; it lost at 2 threads for 16-40 output features (1.2-1.5x the time:
# MobileNet's pointwise convolutions) and was even or ahead from 72 up: 64 and up pack.
register_packed_gemm("mkl", PackedGemm(
    "mkl_packed_linear",
    lambda x, packed, w, bias, rows: (torch.ops.mkl._mkl_linear.default, [x, packed, w, bias, rows]),
    worth=lambda rows, k, n: n >= 64,
    available=lambda: torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")))


DEVICE_LIBRARIES = {
    "cpu": DeviceLibrary((torch.float32,), lambda: torch.backends.mkldnn.is_available(),
                         conv_fused_bias=True, conv_1x1_as_mm=True, addmm_bias_in_consumer=True,
                         packed_gemms=("onednn", "mkl")),
    "cuda": DeviceLibrary((torch.float32, torch.float16, torch.bfloat16), lambda: torch.backends.cudnn.enabled,
                          conv_fused_bias=False, conv_1x1_as_mm=False, addmm_bias_in_consumer=True,
                          addmm_bias_always_apart=True,
                          gemm_out_align={torch.bfloat16: 8, torch.float16: 8}),
}


def conv_prefers_channels_last(device_type: str, dtype: torch.dtype, ndim: int, transposed: bool) -> bool:
    """The one layout choice for convolutions: does a conv of this device/dtype/rank run
    channels-last (activations and weights NHWC)? Devices not in ``DEVICE_LIBRARIES`` keep
    eager's layout."""
    lib = DEVICE_LIBRARIES.get(device_type)
    return lib is not None and ndim == 4 and not transposed and dtype in lib.channels_last and bool(lib.available())


def runs_channels_last(node) -> bool:
    """An ``aten.convolution`` FX node that runs channels-last (``conv_prefers_channels_last``
    on its result's device and dtype)."""
    if node is None or node.op != "call_function" or node.target is not aten.convolution.default:
        return False
    val = node.meta.get("val")
    transposed = node.args[6] if len(node.args) > 6 else False
    return isinstance(val, torch.Tensor) and conv_prefers_channels_last(
        val.device.type, val.dtype, val.dim(), bool(transposed))


def _channels_last_constant(w: ConstantBuffer) -> ConstantBuffer:
    """The weight stored NHWC, once per graph (at compile time: free at run time; the copy
    records the weight it came from, which the runner guards)."""
    return derived_constant(current(), w, "channels_last")


@lowering(aten.convolution.default)
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """An extern call; on convolutions that run channels-last (CPU float32, CUDA fp16/bf16:
    ``runs_channels_last``) the input computed by the graph is
    realized channels-last and a constant weight stored channels-last (``make_extern`` then
    gives the output the layout torch's conv picks for those layouts: channels-last). A 1x1
    convolution over channels-last data is a matrix product (``conv_as_matmul``)."""
    node, meta = current().current_node, meta_val()
    args = [x, weight, bias, stride, padding, dilation, transposed, output_padding, groups]
    lib = DEVICE_LIBRARIES.get(meta.device.type) if isinstance(meta, torch.Tensor) else None
    if runs_channels_last(node):
        if isinstance(x, (Pointwise, GenericView)) and not _is_graph_output(node.args[0]):
            args[0] = realize(x, channels_last_strides(x.get_size()))
        if isinstance(weight, ConstantBuffer) and len(weight.get_size()) == 4:
            args[1] = _channels_last_constant(weight)
        as_matmul = conv_as_matmul(node, *args) if lib.conv_1x1_as_mm else None
        if as_matmul is not None:
            return as_matmul
    if (bias is not None and lib is not None and not lib.conv_fused_bias and not transposed
            and len(bias.get_size()) == 1):
        args[2] = None
        return _plus_bias(make_extern(aten.convolution.default, args, {}, meta, fallback=False), bias, 1)
    return make_extern(aten.convolution.default, args, {}, meta, fallback=False)


# --------------------------------------------------------------------------------------------
# matmul bias in the consumer's kernel; 1x1 convolutions as matrix products
# --------------------------------------------------------------------------------------------

# A/B switch for measurements: False lowers addmm and 1x1 convolutions as plain externs (the
# graph cache does not key on it: compile with KILN_GRAPH_CACHE=0 when flipping it).
MATMUL_REWRITES = True

_VIEW_OPS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def only_pointwise_users(node) -> bool:
    """Every use of ``node`` (looking through views) is an elementwise op: a value computed
    lazily for it is fused into that op's kernel rather than realized on its own."""
    if node is None or not node.users:
        return False
    for u in node.users:
        if u.op != "call_function":
            return False
        if u.target in _VIEW_OPS:
            if not only_pointwise_users(u):
                return False
        elif not (isinstance(u.target, torch._ops.OpOverload) and torch.Tag.pointwise in u.target.tags):
            return False
    return True


def _plus_bias(product, bias, channel_dim: int) -> Pointwise:
    """``product + bias`` broadcast along ``channel_dim``: a lazy Pointwise, so the bias add
    runs in the kernel of the op that reads the product (an activation, a residual add)."""
    load, load_bias = product.make_loader(), bias.make_loader()
    return Pointwise(product.get_device(), product.get_dtype(), product.get_size(),
                     lambda idx: ops.add(load(idx), load_bias([idx[channel_dim]])))


def _bias_in_epilogue(node, bias, channels) -> bool:
    """Move a matmul's float32/64 bias of ``channels`` elements into its consumers' kernel
    when they are all elementwise: the product is then written once (addmm first copies the
    bias into the output, then accumulates into it: one more pass over the result)."""
    lib = DEVICE_LIBRARIES.get(bias.get_device().type) if bias is not None else None
    return (MATMUL_REWRITES and lib is not None and lib.addmm_bias_in_consumer
            and bias.get_dtype() in _EXACT_DTYPES and list(bias.get_size()) == [sympify(channels)]
            and (lib.addmm_bias_always_apart or only_pointwise_users(node)))


_EXACT_DTYPES = (torch.float32, torch.float64)  # half types: addmm rounds once, mm + add twice


#: A/B switch for measurements: False keeps products with constant weights on ``mm``/``addmm``
#: (the graph cache does not key on it: compile with KILN_GRAPH_CACHE=0 when flipping it).
PACKED_LINEAR = True


def constant_weight_operand(a, b):
    """``(W, k, n, strides, rows)`` when ``a [rows, k] @ b [k, n]`` has static sizes and ``b``
    is a constant weight, or an offset-free view of one covering all of it; else None."""
    if isinstance(b, ConstantBuffer):
        b = ReinterpretView(b, b.layout)
    if not isinstance(b, ReinterpretView) or not isinstance(b.data, ConstantBuffer) or len(a.get_size()) != 2:
        return None
    try:
        (k, n), stride = (int(s) for s in b.get_size()), [int(s) for s in b.get_stride()]
        rows = int(a.get_size()[0])
    except (TypeError, ValueError):  # symbolic sizes
        return None
    value = b.data.value
    if b.layout.offset != 0 or value is None or value.numel() != n * k:
        return None
    return b.data, k, n, stride, rows


def packed_linear(a, b, bias, meta):
    """``a @ b (+ bias)`` as the device library's GEMM on a weight packed at compile time,
    when ``b`` is a float32 constant ``W[in, out]`` or the transpose of one ``W[out, in]`` (a
    linear layer's ``W.t()``, a 1x1 convolution's weight, GPT-2's ``Conv1D``) and the sizes
    are static; else None.

    The GEMM is the device library's first available ``packed_gemms``; the packed weight is
    a derived constant (its ``derivation`` of ``W``): kiln guards ``W`` and the graph cache
    packs it again on a hit."""
    lib = DEVICE_LIBRARIES.get(meta.device.type) if isinstance(meta, torch.Tensor) else None
    if not PACKED_LINEAR or lib is None or meta.dtype != torch.float32 or not lib.packed_gemms:
        return None
    operand = constant_weight_operand(a, b)
    if operand is None:
        return None
    weight, k, n, stride, rows = operand
    value = weight.value
    dense = value.is_contiguous() or (value.dim() == 4 and value.is_contiguous(memory_format=torch.channels_last))
    in_out = stride == [n, 1]  # W[in, out] itself, not a transpose
    if (stride != [1, k] and not in_out) or not dense or rows == 0:
        return None
    gemm = packed_gemm(lib, (rows, k, n))
    if gemm is None:
        return None
    packed = derived_constant(current(), weight, gemm.derivation, rows, *([True] if in_out else []))
    origin = ReinterpretView(weight, Layout(meta.device, torch.float32, [n, k], [1, n] if in_out else [k, 1], 0))
    out_meta = meta.new_empty_strided((rows, n), (n, 1))
    op, args = gemm.call(a, packed, origin, bias, rows)
    return make_extern(op, args, {}, out_meta, fallback=False)


#: A/B switch for measurements: False leaves unaligned GEMM outputs unpadded
PAD_GEMM_OUTPUTS = True


def padded_output_matmul(a, b, meta):
    """``a @ W.t()`` for a constant ``W[n, k]`` whose ``n`` the device's GEMM wants aligned
    (``DeviceLibrary.gemm_out_align``) and is not: ``W`` zero-padded to ``n_pad`` rows once at
    compile time (the derived constant ``pad_rows``, guarded and rebuilt like any), the product
    ``[m, n_pad]`` computed on it, and ``[m, n]`` read back as a view of it; else None."""
    lib = DEVICE_LIBRARIES.get(meta.device.type) if isinstance(meta, torch.Tensor) else None
    align = lib.gemm_out_align.get(meta.dtype) if lib is not None and PAD_GEMM_OUTPUTS else None
    operand = constant_weight_operand(a, b) if align else None
    if operand is None:
        return None
    weight, k, n, stride, rows = operand
    if n % align == 0 or stride != [1, k] or not weight.value.is_contiguous():
        return None
    n_pad = -(-n // align) * align
    padded = derived_constant(current(), weight, "pad_rows", n_pad)
    cols = ReinterpretView(padded, Layout(meta.device, meta.dtype, [k, n_pad], [1, k], 0))
    product = make_extern(aten.mm.default, [a, cols], {}, meta.new_empty_strided((rows, n_pad), (n_pad, 1)))
    return ReinterpretView(product, Layout(meta.device, meta.dtype, [rows, n], [n_pad, 1], 0))


def _matmul(a, b, meta):
    """``a @ b``: packed when it can be (``packed_linear``), on an aligned padded weight when
    the device wants it (``padded_output_matmul``), else ``mm``."""
    done = packed_linear(a, b, None, meta) or padded_output_matmul(a, b, meta)
    return done if done is not None else make_extern(aten.mm.default, [a, b], {}, meta)


@lowering(aten.mm.default)
def mm(a, b):
    """An extern call: ``mm``, or the packed-weight GEMM for a constant weight."""
    return _matmul(a, b, meta_val())


@lowering(aten.addmm.default)
def addmm(bias, a, b, *, beta=1, alpha=1):
    """``bias + a @ b``: an extern call; with a 1-d bias and elementwise consumers, ``mm`` and
    the bias added in the consumer's kernel (``_bias_in_epilogue``); with a constant weight,
    on the packed weight (``packed_linear``)."""
    node, meta = current().current_node, meta_val()
    if (beta == 1 and alpha == 1 and isinstance(meta, torch.Tensor) and meta.dtype in _EXACT_DTYPES
            and _bias_in_epilogue(node, bias, current().expr(meta.shape[-1]))):
        return _plus_bias(_matmul(a, b, meta), bias, 1)
    if beta == 1 and alpha == 1 and len(bias.get_size()) == 1:
        packed = packed_linear(a, b, bias, meta)
        if packed is not None:
            return packed
    kwargs = {k: v for k, v in (("beta", beta), ("alpha", alpha)) if v != 1}
    return make_extern(aten.addmm.default, [bias, a, b], kwargs, meta)


def conv_as_matmul(node, x, weight, bias, stride, padding, dilation, transposed, output_padding,
                   groups):
    """A 1x1, stride-1, unpadded, ungrouped convolution over channels-last data
    ``[N, C, H, W]`` (stored NHWC) is ``[N*H*W, C] @ W[K, C].T``: one library matrix product
    on views, no im2col, the result ``[N*H*W, K]`` read back as an NCHW-sized channels-last
    ``[N, K, H, W]`` (what the convolution returns). The bias goes to the consumer's kernel
    when it is elementwise (``_bias_in_epilogue``), else ``addmm``. None when it does not
    apply (the convolution extern runs)."""
    meta = meta_val()
    if (not MATMUL_REWRITES or transposed or groups != 1 or list(stride) != [1, 1] or list(padding) != [0, 0]
            or list(dilation) != [1, 1] or not isinstance(weight, ConstantBuffer)
            or not isinstance(meta, torch.Tensor) or meta.dtype not in _EXACT_DTYPES):
        return None
    if isinstance(x, Buffer):
        x = ReinterpretView(x, x.layout) if x.layout is not None else None
    if not isinstance(x, ReinterpretView):
        return None
    try:
        n, c, h, w = (int(s) for s in x.get_size())
        k, wc, kh, kw = (int(s) for s in weight.get_size())
        xs = [int(s) for s in x.layout.stride]
        ws = [int(s) for s in weight.layout.stride]
    except TypeError:  # symbolic sizes: leave it to the convolution
        return None
    if (kh, kw) != (1, 1) or wc != c or xs[1:] != [1, w * c, c] or (n > 1 and xs[0] != h * w * c):
        return None
    dev, dtype = x.get_device(), x.get_dtype()
    rows = ReinterpretView(x.data, Layout(dev, dtype, [n * h * w, c], [c, 1], x.layout.offset))
    cols = ReinterpretView(weight, Layout(dev, dtype, [c, k], [ws[1], ws[0]], weight.layout.offset))
    product_meta = meta.new_empty_strided((n * h * w, k), (k, 1))
    epilogue = _bias_in_epilogue(node, bias, k)
    if bias is None or epilogue:
        product = _matmul(rows, cols, product_meta)
    else:
        product = (packed_linear(rows, cols, bias, product_meta)
                   or make_extern(aten.addmm.default, [bias, rows, cols], {}, product_meta))
    nhwc = ReinterpretView(product, Layout(dev, dtype, [n, k, h, w], [h * w * k, 1, w * k, k], 0))
    return _plus_bias(nhwc, bias, 1) if epilogue else nhwc


def _is_graph_output(n) -> bool:
    """A graph output keeps eager's layout (realized as the meta strides say)."""
    return isinstance(n, torch.fx.Node) and any(u.op == "output" for u in n.users)
