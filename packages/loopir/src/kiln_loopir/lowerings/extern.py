"""Ops that are extern calls by design (library kernels): matmul family, convolution,
attention (SDPA and nn.MultiheadAttention / nn.TransformerEncoderLayer's fused eval paths).
They are ``ExternKernel``s with ``fallback=False`` (not counted as fallbacks)."""

from __future__ import annotations

import torch
import torch.fx

from ..ir import ConstantBuffer, GenericView, Layout, Pointwise
from ..lowering import current, lowering, make_extern, meta_val, realize
from ..sizevars import sympify

aten = torch.ops.aten

EXTERN_OPS = []
for _name in ["mm.default", "bmm.default", "addmm.default", "baddbmm.default", "addbmm.default",
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
              "scaled_dot_product_attention.default", "_native_multi_head_attention.default",
              "_transformer_encoder_layer_fwd.default",
              "_weight_int8pack_mm.default", "dot.default", "mv.default", "addmv.default"]:
    _pkt, _, _ov = _name.partition(".")
    _p = getattr(aten, _pkt, None)
    if _p is not None and hasattr(_p, _ov):
        EXTERN_OPS.append(getattr(_p, _ov))


def _make(op):
    def lower_fn(*args, **kwargs):
        return make_extern(op, args, kwargs, meta_val(), fallback=False)

    return lower_fn


for _op in EXTERN_OPS:
    lowering(_op)(_make(_op))


# --------------------------------------------------------------------------------------------
# convolution: channels-last on CPU
# --------------------------------------------------------------------------------------------


def channels_last_strides(size) -> list:
    """Strides of an NCHW-sized tensor stored NHWC."""
    _, c, h, w = (sympify(s) for s in size)
    return [c * h * w, sympify(1), w * c, c]


def runs_channels_last(node) -> bool:
    """A float32 2-d convolution on CPU: oneDNN runs it fastest with channels-last (NHWC)
    activations and weights (resnet18: ~25% less time than NCHW), as torch.compile does."""
    if node is None or node.op != "call_function" or node.target is not aten.convolution.default:
        return False
    val = node.meta.get("val")
    transposed = node.args[6] if len(node.args) > 6 else False
    return (isinstance(val, torch.Tensor) and val.device.type == "cpu" and val.dtype == torch.float32
            and val.dim() == 4 and not transposed and torch.backends.mkldnn.is_available())


def _channels_last_constant(w: ConstantBuffer) -> ConstantBuffer:
    """The weight stored NHWC, once per graph (at compile time: free at run time; the copy
    records the weight it came from, which the runner guards)."""
    g = current()
    cache = g.__dict__.setdefault("_channels_last_constants", {})
    if w.name not in cache:
        value = w.value.contiguous(memory_format=torch.channels_last)
        layout = Layout(value.device, value.dtype, list(value.shape), list(value.stride()), 0)
        name = f"const{g._const_count}"
        g._const_count += 1
        cache[w.name] = g.graph.add_constant(
            ConstantBuffer(name, layout, value, w.target, derived_from=w.value))
    return cache[w.name]


@lowering(aten.convolution.default)
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """An extern call; on CPU float32 2-d convolutions the input computed by the graph is
    realized channels-last and a constant weight stored channels-last (``make_extern`` then
    gives the output the layout torch's conv picks for those layouts: channels-last)."""
    node, meta = current().current_node, meta_val()
    args = [x, weight, bias, stride, padding, dilation, transposed, output_padding, groups]
    if runs_channels_last(node):
        if isinstance(x, (Pointwise, GenericView)) and not _is_graph_output(node.args[0]):
            args[0] = realize(x, channels_last_strides(x.get_size()))
        if isinstance(weight, ConstantBuffer) and len(weight.get_size()) == 4:
            args[1] = _channels_last_constant(weight)
    return make_extern(aten.convolution.default, args, {}, meta, fallback=False)


def _is_graph_output(n) -> bool:
    """A graph output keeps eager's layout (realized as the meta strides say)."""
    return isinstance(n, torch.fx.Node) and any(u.op == "output" for u in n.users)
