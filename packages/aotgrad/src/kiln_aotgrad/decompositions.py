"""kiln's decomposition table: which ATen ops aotgrad rewrites into smaller ones.

One rule table, built once:

1. start from ``torch._decomp.core_aten_decompositions()`` (torch's own table that lowers
   ATen to the Core ATen IR);
2. add torch's decompositions for the composite ops that loopir should see as their pieces
   (softmax, the norms, gelu & friends: see ``_FROM_TORCH``);
3. add kiln's own rules (``@_rule``) where torch's decomposition leaves ``prims`` ops in the
   graph (var / var_mean), where it has none (lift_fresh_copy, the backward of CPU flash
   attention kernels in training graphs) or where it rounds unlike eager (CPU batch norm);
4. remove the ops kiln keeps whole as extern-call candidates (``KEEP``: matmul family,
   convolution, scaled-dot-product attention kernels).

Beside the table, ``FUNCTION_RULES`` rewrites a few torch functions *before* they reach the
dispatcher (``function_rules()``, a TorchFunctionMode active during the trace): composite
ops whose C++ implementation reads concrete sizes under functionalization, which would
specialize dynamic sizes (``F.linear`` on a 3-D input with a bias).

The ops that can remain after this table are listed in ``kiln_aotgrad.core_ops.CORE_OPS``
(docs/ops.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.symbolic_shapes import statically_known_true

aten = torch.ops.aten

__all__ = ["core_decompositions", "KEEP", "KILN_RULES", "FUNCTION_RULES", "function_rules"]


def _ops(*names: str) -> list[torch._ops.OpOverload]:
    """Resolve "packet.overload" names; skip those this torch build lacks."""
    out = []
    for name in names:
        packet, _, overload = name.partition(".")
        pkt = getattr(aten, packet, None)
        if pkt is None:
            continue
        op = getattr(pkt, overload or "default", None)
        if op is not None:
            out.append(op)
    return out


# Composite ops that torch's core table keeps whole but kiln decomposes (with torch's own
# rules from torch._decomp.decomposition_table): loopir then sees reductions and pointwise
# ops it fuses, and needs no lowering for these.
_FROM_TORCH = _ops(
    "_softmax.default",
    "_log_softmax.default",
    "native_layer_norm.default",
    "native_group_norm.default",
    "gelu.default",
    "elu.default",
    "leaky_relu.default",
    "hardtanh.default",
)

# Ops kept whole: extern-call candidates for the codegens (and their aten fallback).
KEEP = frozenset(
    _ops(
        "mm.default",
        "bmm.default",
        "addmm.default",
        "convolution.default",
        "_scaled_dot_product_flash_attention_for_cpu.default",
        "_scaled_dot_product_flash_attention.default",
        "_scaled_dot_product_efficient_attention.default",
        "_scaled_dot_product_cudnn_attention.default",
    )
)

KILN_RULES: dict[torch._ops.OpOverload, Callable] = {}


def _rule(*ops: torch._ops.OpOverload):
    def register(fn):
        for op in ops:
            KILN_RULES[op] = fn
        return fn

    return register


def _reduced_dims(x: torch.Tensor, dim) -> list[int]:
    if dim is None:
        return list(range(x.dim()))
    if isinstance(dim, int):
        dim = [dim]
    dims = list(dim)
    if not dims:  # dim=[] means "all dims" for var
        return list(range(x.dim()))
    return [d % max(x.dim(), 1) for d in dims]


def _var_mean(x: torch.Tensor, dim, correction, keepdim: bool):
    """Two-pass variance (mean, then the mean of squared deviations) in aten ops only."""
    dims = _reduced_dims(x, dim)
    n = 1
    for d in dims:
        n = n * x.shape[d]
    if correction is None:
        correction = 1
    orig_dtype = x.dtype
    if orig_dtype in (torch.float16, torch.bfloat16):
        x = x.to(torch.float32)
    mean = torch.sum(x, dims, keepdim=True) / n
    dev = x - mean
    denom = n - correction if correction else n
    if isinstance(denom, torch.SymInt | torch.SymFloat):
        if not statically_known_true(denom >= 0):
            denom = torch.sym_max(denom, 0)
    else:
        denom = max(denom, 0)
    var = torch.sum(dev * dev, dims, keepdim=keepdim) / denom
    if not keepdim:
        mean = torch.squeeze(mean, dims)
    return var.to(orig_dtype), mean.to(orig_dtype)


def welford_in_loopir(x: torch.Tensor) -> bool:
    """Whether var/var_mean/std stay whole for loopir's one-pass Welford reductions: on CUDA,
    where the Triton codegen then reads a long row once instead of twice. On CPU the two
    sums below vectorize in the C++ codegen, so there the rules rewrite them."""
    return x.device.type == "cuda"


@_rule(aten.var.correction)
def _var_correction(x, dim=None, *, correction=None, keepdim=False):
    if welford_in_loopir(x):
        return NotImplemented
    return _var_mean(x, dim, correction, keepdim)[0]


@_rule(aten.var_mean.correction)
def _var_mean_correction(x, dim=None, *, correction=None, keepdim=False):
    if welford_in_loopir(x):
        return NotImplemented
    return _var_mean(x, dim, correction, keepdim)


@_rule(aten.var.dim)
def _var_dim(x, dim=None, unbiased=True, keepdim=False):
    return _var_mean(x, dim, 1 if unbiased else 0, keepdim)[0]


@_rule(aten.var_mean.dim)
def _var_mean_dim(x, dim=None, unbiased=True, keepdim=False):
    return _var_mean(x, dim, 1 if unbiased else 0, keepdim)


@_rule(aten.std.correction)
def _std_correction(x, dim=None, *, correction=None, keepdim=False):
    if welford_in_loopir(x):
        return NotImplemented
    return torch.sqrt(_var_mean(x, dim, correction, keepdim)[0])


BATCH_NORM_STATS_DTYPE = torch.float64


def _batch_norm_cpu(input, weight, bias, running_mean, running_var, training, momentum, eps,
                    functional):
    """Batch norm as torch's CPU kernel computes it (float32/float64 on CPU): the statistics
    summed in float64 (``acc_type``), mean and var_sum rounded to the input's dtype, ``var_sum /
    n`` too, ``invstd = 1 / sqrt(var + eps)`` in float64 (save_mean and save_invstd then equal
    eager's bitwise), then ``out = x * alpha + beta`` with ``alpha = invstd * w`` and
    ``beta = b - mean * alpha`` (the C++ codegen contracts both to FMAs, as torch's build does).
    torch's decomposition, ``(x - mean) * rstd * w + b`` over float sums, rounds differently: at
    ``x == mean`` it gives exactly 0 where eager gives the product's rounding error, and a ReLU
    after it flips (timm mobilenetv3_small_100 trained with gradients off by 1e-2, issue 25).
    Returns (out, save_mean, save_invstd, new_running_mean, new_running_var)."""
    dims = [0, *range(2, input.dim())]
    shape = [-1] + [1] * (input.dim() - 2)
    if training:
        n = input.numel() // input.shape[1]
        acc = BATCH_NORM_STATS_DTYPE or input.dtype
        mean = (torch.sum(input, dims, dtype=acc) / n).to(input.dtype)
        dev = input - mean.reshape(shape)
        var_sum = torch.sum(dev * dev, dims, dtype=acc).to(input.dtype)
        invstd = (1 / torch.sqrt((var_sum / n).to(torch.float64) + eps)).to(input.dtype)
        save_mean, save_invstd = mean, invstd
        new_mean, new_var = running_mean, running_var
        if running_mean is not None:
            new_mean = momentum * mean + (1 - momentum) * running_mean
        if running_var is not None:
            unbiased = var_sum / (n - 1)
            new_var = momentum * unbiased + (1 - momentum) * running_var
        if not functional:
            if running_mean is not None:
                running_mean.copy_(new_mean)
            if running_var is not None:
                running_var.copy_(new_var)
    else:
        mean = running_mean.to(input.dtype)
        invstd = torch.rsqrt(running_var.to(input.dtype) + eps)  # as eager (not 1 / sqrt)
        save_mean = save_invstd = input.new_zeros((0,))
        new_mean, new_var = running_mean, running_var
    alpha = invstd if weight is None else invstd * weight.flatten()
    beta = -(mean * alpha) if bias is None else bias.flatten() - mean * alpha
    out = input * alpha.reshape(shape) + beta.reshape(shape)
    return out, save_mean, save_invstd, new_mean, new_var


def _eager_batch_norm(input) -> bool:
    return input.device.type == "cpu" and input.dtype in (torch.float32, torch.float64)


def _torch_rule(op):
    from torch._decomp import decomposition_table

    return decomposition_table[op]


# batch norm: eager's CPU arithmetic (float32/float64), torch's decomposition elsewhere
@_rule(aten.native_batch_norm.default, aten._native_batch_norm_legit.default)
def _native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    if not _eager_batch_norm(input):
        return _torch_rule(aten.native_batch_norm.default)(
            input, weight, bias, running_mean, running_var, training, momentum, eps)
    return _batch_norm_cpu(input, weight, bias, running_mean, running_var, training, momentum,
                           eps, False)[:3]


@_rule(aten._native_batch_norm_legit.no_stats)
def _native_batch_norm_no_stats(input, weight, bias, training, momentum, eps):
    if not _eager_batch_norm(input):
        return _torch_rule(aten._native_batch_norm_legit.no_stats)(
            input, weight, bias, training, momentum, eps)
    return _batch_norm_cpu(input, weight, bias, None, None, training, momentum, eps, False)[:3]


@_rule(aten._native_batch_norm_legit_no_training.default)
def _native_batch_norm_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    if not _eager_batch_norm(input):
        return _torch_rule(aten._native_batch_norm_legit_no_training.default)(
            input, weight, bias, running_mean, running_var, momentum, eps)
    return _batch_norm_cpu(input, weight, bias, running_mean, running_var, False, momentum, eps,
                           False)[:3]


@_rule(aten._native_batch_norm_legit_functional.default)
def _native_batch_norm_functional(input, weight, bias, running_mean, running_var, training,
                                  momentum, eps):
    if not _eager_batch_norm(input):
        return _torch_rule(aten._native_batch_norm_legit_functional.default)(
            input, weight, bias, running_mean, running_var, training, momentum, eps)
    return _batch_norm_cpu(input, weight, bias, running_mean, running_var, training, momentum,
                           eps, True)


@_rule(aten.lift_fresh_copy.default)
def _lift_fresh_copy(x):
    # a tensor constant built inside the traced code (torch.tensor(...)): a plain copy
    return aten.clone.default(x)


def _attention_backward(grad_out, query, key, value, out, logsumexp, is_causal, attn_mask, scale):
    """Grads of q, k, v of softmax attention, in matmuls and pointwise ops: the probabilities
    are recomputed from the forward's ``logsumexp`` as flash attention does, so the forward
    stays one extern kernel and saves no ``L x S`` matrix."""
    dtype = query.dtype
    if dtype in (torch.float16, torch.bfloat16):  # computed in float32, as the kernels do
        grad_out, query, key, value, out = (t.float() for t in (grad_out, query, key, value, out))
    L, S = query.shape[-2], key.shape[-2]
    s = scale if scale is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(-2, -1)) * s
    if is_causal:
        keep = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask.float()
    # the CUDA memory-efficient kernel pads logsumexp's last dim to a multiple of 32
    lse = logsumexp[..., :L].float()
    probs = torch.exp(scores - lse.unsqueeze(-1))
    grad_value = torch.matmul(probs.transpose(-2, -1), grad_out)
    grad_probs = torch.matmul(grad_out, value.transpose(-2, -1))
    delta = (grad_out * out).sum(-1, keepdim=True)
    grad_scores = probs * (grad_probs - delta) * s
    grad_query = torch.matmul(grad_scores, key)
    grad_key = torch.matmul(grad_scores.transpose(-2, -1), query)
    return grad_query.to(dtype), grad_key.to(dtype), grad_value.to(dtype)


def _grouped_heads(query, key) -> bool:
    return key.dim() < 3 or key.shape[-3] != query.shape[-3]


# The backward of CPU flash attention (training graphs) is kept whole by default: loopir calls
# it as an extern, as eager does. Decomposed (DECOMPOSE_CPU_FLASH_BACKWARD, an A/B switch) it
# becomes matmuls and pointwise ops, but its probability recompute q @ k^T does not depend on
# the tangents, so the partition moves it into the forward and saves the L x S probabilities:
# the forward did the attention twice (transformer block, d 256, 8x64 tokens: 3% slower per
# training step on one thread, and 2 MB more saved). With dropout (a random mask only the
# kernel knows) or grouped heads the op is always kept. The CUDA kernels' backwards (flash,
# memory-efficient, cuDNN) are always kept: library kernels that never build the L x S matrix.
DECOMPOSE_CPU_FLASH_BACKWARD = False


@_rule(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _flash_attention_cpu_backward(
    grad_out,
    query,
    key,
    value,
    out,
    logsumexp,
    dropout_p,
    is_causal,
    *,
    attn_mask=None,
    scale=None,
):
    if not DECOMPOSE_CPU_FLASH_BACKWARD or dropout_p != 0.0 or _grouped_heads(query, key):
        return NotImplemented
    return _attention_backward(
        grad_out, query, key, value, out, logsumexp, is_causal, attn_mask, scale
    )


@_rule(aten.embedding_dense_backward.default)
def _embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    """Kept whole on CPU (an extern call): eager's kernel accumulates rows per index, where
    torch's decomposition (``index_put`` with accumulate) becomes one atomic add per element,
    all of them into the same few rows for a token-type or position table (BERT-small,
    8x64 tokens, d 128: 1.75 ms in kiln's scatter kernels against 0.15 ms in eager's op).
    On other devices, torch's decomposition (a scatter in the generated kernel)."""
    if grad_output.device.type == "cpu":
        return NotImplemented
    from torch._decomp import decomposition_table

    return decomposition_table[aten.embedding_dense_backward.default](
        grad_output, indices, num_weights, padding_idx, scale_grad_by_freq
    )


# ---------------------------------------------------------------- torch-function-level rules

FUNCTION_RULES: dict[Callable, Callable] = {}


def _function_rule(*fns: Callable):
    def register(rule):
        for fn in fns:
            FUNCTION_RULES[fn] = rule
        return rule

    return register


@_function_rule(torch.nn.functional.linear)
def _linear(x, weight, bias=None):
    """``F.linear`` with a bias on an input of 3 or more dims: flatten the leading dims, one
    ``addmm``, unflatten. The C++ composite does the same for 3-D inputs, but under
    ``torch.func.functionalize`` it asks the wrapper for concrete sizes (``aten.size``),
    which turns a dynamic batch/sequence dim into a constant."""
    if bias is None or x.dim() < 3 or weight.dim() != 2:
        return NotImplemented
    lead = x.shape[:-1]
    out = aten.addmm.default(bias, x.reshape(-1, x.shape[-1]), weight.t())
    return out.view(*lead, weight.shape[0])


#: head dims the memory-efficient attention kernel takes for float16/bfloat16 (multiples of
#: 8 up to 128: forward and backward on every CUDA architecture torch builds it for)
_EFFICIENT_HEAD_DIMS = range(8, 129, 8)


def _asked_outside_the_trace(question: Callable[[], bool]) -> bool:
    """``question()`` about the traced tensors, asked outside the proxy modes so that it is no
    node of the graph (a ``_fused_sdp_choice`` node has no lowering); False where torch cannot
    answer it (symbolic sizes, a torch without the check): the call is then left to torch."""
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    try:
        with disable_proxy_modes_tracing():
            return bool(question())
    except Exception:  # noqa: BLE001
        return False


def _traced_choice_is_math(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> bool:
    """The backend torch's composite picks for the traced tensors is its math path."""
    from torch.nn.attention import SDPBackend

    return _asked_outside_the_trace(lambda: int(torch._fused_sdp_choice(
        q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)) == SDPBackend.MATH.value)


def _cudnn_takes(q, k, v, bias, is_causal) -> bool:
    """cuDNN's fused attention takes these tensors, by torch's own check."""
    return _asked_outside_the_trace(lambda: torch.backends.cuda.can_use_cudnn_attention(
        torch.backends.cuda.SDPAParams(q, k, v, bias, 0.0, is_causal, False), False))


@_function_rule(torch.nn.functional.scaled_dot_product_attention)
def _sdpa_on_cuda(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False):
    """Scaled-dot-product attention on CUDA half tensors where torch's composite would take its
    math path: a fused kernel, as eager's dispatcher picks one for real tensors. For inference,
    cuDNN's where torch's check says it takes the tensors (GPT-2 fp16, batch 8, seq 512: 0.41 ms
    for 12 layers against the memory-efficient kernel's 1.11 ms); otherwise, and for training,
    the memory-efficient kernel (and its backward).

    Under the trace (a training graph with a mask), torch's composite picks its backend from
    the traced (functional) tensors and takes the math path: two batched matmuls that upcast
    float16 to float32 (SIMT GEMMs) and a softmax between them. BERT-base training on an H200
    (batch 8, seq 512) spent 6.5 ms of a 16 ms step there; the fused kernel does a layer's
    forward and backward in 0.3 ms against 1.3. Where the traced choice is a fused kernel, it
    stands (kiln's traces, on fake tensors, got the math path where torch.compile's got cuDNN
    for GPT-2's inference). The mask is given as eager's composite gives it:
    boolean masks as an additive 0/-inf bias of the query's dtype, rows padded to 16
    elements, broadcast to (batch, heads, L, S). Anything the kernel may not take (dropout,
    grouped heads, a mask that needs a gradient, other dtypes or head dims) keeps
    torch's own path."""
    q, k, v = query, key, value
    if not (q.is_cuda and q.dim() == 4 and k.dim() == 4 and v.dim() == 4):
        return NotImplemented
    if not _traced_choice_is_math(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        return NotImplemented  # torch's own fused choice stands
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return NotImplemented
    if dropout_p != 0.0 or enable_gqa or k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
        return NotImplemented
    if q.shape[-1] not in _EFFICIENT_HEAD_DIMS or v.shape[-1] not in _EFFICIENT_HEAD_DIMS:
        return NotImplemented
    bias = None
    if attn_mask is not None:
        if is_causal or attn_mask.requires_grad or attn_mask.dim() > 4:
            return NotImplemented
        if attn_mask.dtype == torch.bool:
            bias = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(
                attn_mask.logical_not(), float("-inf"))
        elif attn_mask.dtype == q.dtype:
            bias = attn_mask
        else:
            return NotImplemented
        source = k.shape[-2]
        pad = -source % 16  # rows start on 16-element boundaries, as the kernel reads them
        if not statically_known_true(pad == 0):
            if not isinstance(source, int):  # a symbolic length that may need padding
                return NotImplemented
            bias = torch.nn.functional.pad(bias, (0, pad))[..., :source]
        # a broadcast view, as eager passes it (loopir keeps it a stride-0 view of the mask)
        bias = bias.expand(q.shape[0], q.shape[1], q.shape[-2], source)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if not grad and _cudnn_takes(q, k, v, bias, is_causal):  # inference: cuDNN's kernel
        return aten._scaled_dot_product_cudnn_attention.default(
            q, k, v, bias, False, dropout_p, is_causal, False, scale=scale)[0]
    out = aten._scaled_dot_product_efficient_attention.default(
        q, k, v, bias, grad, dropout_p, is_causal, scale=scale)
    return out[0]


def _recurrent_rule(name: str, packed_at: int) -> Callable:
    """``torch._VF.<name>`` (``nn.LSTM``/``GRU``/``RNN``'s kernel call) as torch's own Python
    decomposition of ``aten.<name>.input`` (or ``.data``, packed sequences: a tensor of batch
    sizes at position ``packed_at``): per-layer, per-step matmuls and pointwise ops.

    The C++ composite on CUDA takes cuDNN's path, which flattens the weights into one buffer
    and points them into it (``set_`` with a storage, which no graph can hold): timm's
    sequencer2d failed to trace on an H200 and ran eagerly. On CPU the decomposition takes
    the same ``mkldnn_rnn_layer`` for LSTM as the C++ path, and gives GRU and RNN as pure
    ops (their C++ path wrote an intermediate in place, which loopir declines).

    When a gradient is wanted, the decomposition runs with oneDNN off: its LSTM layer picks
    ``mkldnn_rnn_layer`` whenever the layer's *input* does not require grad, and calls it with
    ``train=False``, so no workspace exists for the backward that the weights' gradients
    need (a bidirectional 2-layer LSTM's training graph crashed on the missing workspace)."""
    from torch._decomp import decomposition_table

    packet = getattr(aten, name)
    by_input, by_data = decomposition_table[packet.input], decomposition_table[packet.data]

    def rule(*args, **kwargs):
        if kwargs or len(args) <= packed_at:
            return NotImplemented
        decomposition = by_data if isinstance(args[packed_at], torch.Tensor) else by_input
        wants_grad = torch.is_grad_enabled() and any(
            t.requires_grad for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor))
        if wants_grad:
            with torch.backends.mkldnn.flags(enabled=False):
                return decomposition(*args)
        return decomposition(*args)

    return rule


# lstm(input, hx: [h, c], ...) / lstm(data, batch_sizes, hx, ...); the others take hx as one
# tensor: gru(input, hx, params, ...) / gru(data, batch_sizes, hx, ...)
for _name, _packed_at in (("lstm", 1), ("gru", 2), ("rnn_tanh", 2), ("rnn_relu", 2)):
    _function_rule(getattr(torch._C._VariableFunctions, _name))(_recurrent_rule(_name, _packed_at))


class _FunctionRules(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rule = FUNCTION_RULES.get(func)
        if rule is not None:
            out = rule(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


def function_rules() -> torch.overrides.TorchFunctionMode:
    """A TorchFunctionMode applying ``FUNCTION_RULES`` (enter it inside the traced function)."""
    return _FunctionRules()


@functools.lru_cache(maxsize=1)
def _table() -> dict:
    from torch._decomp import core_aten_decompositions, decomposition_table

    table = dict(core_aten_decompositions())
    for op in _FROM_TORCH:
        if op in decomposition_table:
            table[op] = decomposition_table[op]
    table.update(KILN_RULES)
    for op in KEEP:
        table.pop(op, None)
    return table


def core_decompositions() -> dict:
    """op -> decomposition: the table aotgrad traces with (a fresh copy each call)."""
    return dict(_table())
