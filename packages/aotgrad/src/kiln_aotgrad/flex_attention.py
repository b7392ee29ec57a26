"""FlexAttention as dense ATen math: the rule that replaces
``torch.ops.higher_order.flex_attention`` while aotgrad traces (a ``FUNCTION_RULES`` entry,
applied by the TorchFunctionMode both traces run under, so ``make_fx`` never meets the
operator itself).

The rule is torch's own reference (``math_attention``/``sdpa_dense``) written without vmap:

    scores = (q @ k^T) * scale                       (float32, float64 for float64 inputs)
    scores = score_mod(scores, b, h, q_idx, kv_idx)   on broadcast index grids
    scores = where(mask_mod(b, h, q_idx, kv_idx), scores, -inf)
    p = softmax(scores) (a row with every score masked is all zeros), out = p @ v

The mods are the node's subgraphs; their arguments are int32 grids shaped [B,1,1,1],
[1,H,1,1], [1,1,L,1], [1,1,1,S], so every elementwise op broadcasts to the scores' shape and
``aten.index`` of a captured table by index tensors gathers per position. Autograd then gives
dq, dk, dv and the captured tables' gradients through plain ATen ops, and loopir lowers them
like any graph's. The BlockMask's block tensors are not read: the mask is ``mask_mod``
evaluated everywhere, as in torch's reference (they describe the same mask).

Where a fused kernel takes the call (``set_fused_choice``: the full stack installs the one
place that decides, from the compile's codegen and the inputs), the rule keeps the operator
instead: it is traced as itself (its mods as subgraphs) and loopir lowers it to that kernel.
Under grad, torch's own autograd rule of the operator then puts a ``flex_attention_backward``
node (score_mod's joint graph as a subgraph) in the joint graph, which a fused backward
kernel runs. Captured tables that need grad keep the dense rule (the fused kernels do not
compute their gradients).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch._higher_order_ops.flex_attention import flex_attention as flex_attention_hop

from .decompositions import FUNCTION_RULES

_LN2 = math.log(2.0)


def _grids(b: int, h: int, m: int, n: int, device) -> list[torch.Tensor]:
    shapes = ((b, 1, 1, 1), (1, h, 1, 1), (1, 1, m, 1), (1, 1, 1, n))
    return [torch.arange(s, dtype=torch.int32, device=device).view(shape)
            for s, shape in zip((b, h, m, n), shapes, strict=True)]


#: (query, key, value, block_mask, needs_grad) -> True where a fused kernel takes this call
_fused_choice: list[Callable[..., bool]] = []


def set_fused_choice(fn: Callable[..., bool]) -> None:
    """Install what decides that a call keeps the operator for a fused kernel (the last one
    installed is asked)."""
    _fused_choice.append(fn)


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def flex_attention_rule(query, key, value, score_mod, block_mask, scale, kernel_options,
                        score_mod_other_buffers=(), mask_mod_other_buffers=()):
    """The operator itself where a fused kernel takes it, else ``flex_attention_dense``."""
    if (_fused_choice and not _needs_grad(*score_mod_other_buffers, *mask_mod_other_buffers)
            and _fused_choice[-1](query, key, value, block_mask,
                                  _needs_grad(query, key, value))):
        return NotImplemented
    return flex_attention_dense(query, key, value, score_mod, block_mask, scale, kernel_options,
                                score_mod_other_buffers, mask_mod_other_buffers)


def flex_attention_dense(query, key, value, score_mod, block_mask, scale, kernel_options,
                         score_mod_other_buffers=(), mask_mod_other_buffers=()):
    """(out, logsumexp / ln 2, max / ln 2), as the operator returns them."""
    mask_mod = block_mask[-1]
    groups = query.size(1) // key.size(1)
    if groups != 1:  # grouped-query attention: kv heads shared by ``groups`` query heads
        key = torch.repeat_interleave(key, groups, dim=1)
        value = torch.repeat_interleave(value, groups, dim=1)
    B, H, L = query.shape[:3]
    key = key.expand(B, *key.shape[1:])
    value = value.expand(B, *value.shape[1:])
    S = key.size(2)
    working = torch.float64 if query.dtype == torch.float64 else torch.float32
    scores = query.to(working) @ key.to(working).transpose(-2, -1)
    scores = scores * scale
    b, h, m, n = _grids(B, H, L, S, query.device)
    scored = score_mod(scores, b, h, m, n, *score_mod_other_buffers).to(working)
    keep = mask_mod(b, h, m, n, *mask_mod_other_buffers)
    scored = torch.where(keep, scored, torch.tensor(-math.inf, dtype=working,
                                                    device=query.device))
    scored = scored.expand(B, H, L, S)
    row_max = scored.amax(dim=-1, keepdim=True)
    # a row with every score masked: max -inf; shift by 0 there so exp gives zeros, not nan
    safe_max = torch.where(row_max == -math.inf, torch.zeros_like(row_max), row_max)
    e = torch.exp(scored - safe_max)
    total = e.sum(dim=-1, keepdim=True)
    probs = e / torch.where(total == 0, torch.ones_like(total), total)
    lse = (torch.log(total) + safe_max).squeeze(-1)  # -inf on a fully masked row
    out = probs.to(query.dtype) @ value.to(query.dtype)
    if out.stride() != query.stride():  # the operator's result has the query's layout
        from torch._higher_order_ops.flex_attention import _permute_strides

        out = _permute_strides(out, query.stride())
    return out, lse.to(torch.float32) / _LN2, row_max.squeeze(-1).to(torch.float32) / _LN2


FUNCTION_RULES[flex_attention_hop] = flex_attention_rule
