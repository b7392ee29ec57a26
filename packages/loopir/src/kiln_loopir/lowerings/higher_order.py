"""Higher-order operators of ATen graphs: ``torch.ops.higher_order.cond``, ``while_loop``,
``map_impl`` and ``scan``, whose bodies are ATen GraphModules (``get_attr`` of the graph), and
``flex_attention`` where a codegen's fused kernel was chosen for it (the end of this module).

Each body is compiled on its own, when the node is lowered, by the subgraph compiler the full
stack installs (``set_subgraph_compiler``: kiln compiles it with the same pipeline as any
graph; without one, the body's ATen ops run eagerly). The node becomes one extern call of an
operator of the ``kiln_hop`` library that runs the compiled bodies: ``cond`` picks a branch by
the predicate's value (the one host read), ``while_loop`` runs cond and body until cond is
false, ``map`` runs the body on each slice of its mapped inputs and ``scan`` on the carry and
each slice, each step's results copied into the stacked outputs. The compiled bodies live in this process (``SUBGRAPHS``, by key); a graph holding such
a call is not cacheable across processes (the full stack says so when it compiles one).

The extern's results are fresh tensors in the layouts the node's ``meta["val"]`` gives (the
kernels after it index them so): a body's result that aliases an input, or has other strides,
is copied.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from ..lowering import LoweringError, current, lowering, make_extern

#: (body GraphModule, example inputs) -> callable(*tensors) -> sequence of tensors
_compiler: list[Callable[[torch.fx.GraphModule, list], Callable]] = []


def set_subgraph_compiler(fn: Callable[[torch.fx.GraphModule, list], Callable]) -> None:
    """Install how bodies are compiled (the last one installed is used)."""
    _compiler.append(fn)


def _eager(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    return gm


class Body:
    """One compiled body and the layouts its results must have. Bodies are compiled for
    contiguous inputs (``_compile_body``) and their arguments made contiguous when they are
    not (map's slice of an expanded gradient, scan's slice of a moved dimension): the compiled
    kernels index their inputs by the layouts they were compiled for, and the layouts the
    trace gave a body's placeholders (stride 0 of an expanded tangent) need not be those of
    the values it is called with."""

    def __init__(self, gm: torch.fx.GraphModule, fn: Callable, strides: list):
        self.gm = gm
        self.fn = fn
        self.strides = strides  # per output: a tuple of ints, or None (any dense layout)

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        out = self.fn(*[a.contiguous() if isinstance(a, torch.Tensor) else a for a in args])
        return list(out) if isinstance(out, (tuple, list)) else [out]


#: key (in the wrapper's source) -> compiled body
SUBGRAPHS: dict[str, Body] = {}
_keys = itertools.count()


def _static_strides(meta: Any) -> list:
    g = current()
    out = []
    for m in (meta if isinstance(meta, (list, tuple)) else [meta]):
        layout = g.layout_of(m)
        strides = [sympy.sympify(s) for s in layout.stride]
        out.append(tuple(int(s) for s in strides) if all(s.is_number for s in strides)
                   else None)
    return out


def _contiguous(example: Any) -> Any:
    """A placeholder's example value in the contiguous layout (see ``Body``)."""
    if not isinstance(example, torch.Tensor) or example.is_contiguous():
        return example
    with example.fake_mode if hasattr(example, "fake_mode") else contextlib.nullcontext():
        return torch.empty_strided(example.shape, torch._prims_common.make_contiguous_strides_for(
            example.shape), dtype=example.dtype, device=example.device)


def _compile_body(gm: torch.fx.GraphModule, kind: str, out_meta: Any) -> str:
    example = [_contiguous(n.meta["val"]) for n in gm.graph.nodes if n.op == "placeholder"]
    compiler = _compiler[-1] if _compiler else _eager
    key = f"{kind}_{next(_keys)}"
    SUBGRAPHS[key] = Body(gm, compiler(gm, example), _static_strides(out_meta))
    return key


def _fresh(outs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], body: Body,
           ) -> list[torch.Tensor]:
    """Results that share no memory with an input, in the layouts the graph expects."""
    storages = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
    fixed = []
    for i, o in enumerate(outs):
        stride = body.strides[i] if i < len(body.strides) else None
        aliased = o.untyped_storage().data_ptr() in storages
        if stride is not None and (aliased or tuple(o.stride()) != stride):
            new = torch.empty_strided(o.shape, stride, dtype=o.dtype, device=o.device)
            new.copy_(o)
            o = new
        elif aliased or (stride is None and not o.is_contiguous()):
            o = o.clone(memory_format=torch.contiguous_format)
        fixed.append(o)
    return fixed


_lib = torch.library.Library("kiln_hop", "DEF")
_lib.define("cond(Tensor pred, str true_key, str false_key, Tensor[] operands) -> Tensor[]")
_lib.define("while_loop(str cond_key, str body_key, Tensor[] carried, Tensor[] additional)"
            " -> Tensor[]")
_lib.define("map(str body_key, Tensor[] xs, Tensor[] args) -> Tensor[]")
_lib.define("scan(str body_key, Tensor[] init, Tensor[] xs, Tensor[] additional) -> Tensor[]")


def _cond(pred: torch.Tensor, true_key: str, false_key: str,
          operands: list[torch.Tensor]) -> list[torch.Tensor]:
    body = SUBGRAPHS[true_key if bool(pred) else false_key]
    return _fresh(body(*operands), operands, body)


def _while_loop(cond_key: str, body_key: str, carried: list[torch.Tensor],
                additional: list[torch.Tensor]) -> list[torch.Tensor]:
    cond, body = SUBGRAPHS[cond_key], SUBGRAPHS[body_key]
    values = list(carried)
    while bool(cond(*values, *additional)[0]):
        values = body(*values, *additional)
    return _fresh(values, [*carried, *additional], body)


def _stacked(body: Body, first: int, steps: int, step: Sequence[torch.Tensor],
             ) -> list[torch.Tensor]:
    """Buffers for ``steps`` stacked copies of ``step``, in the layouts the graph expects
    (``body.strides`` from output ``first`` on)."""
    out = []
    for i, t in enumerate(step):
        stride = body.strides[first + i] if first + i < len(body.strides) else None
        shape = (steps, *t.shape)
        out.append(torch.empty(shape, dtype=t.dtype, device=t.device) if stride is None else
                   torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device))
    return out


def _map(body_key: str, xs: list[torch.Tensor], args: list[torch.Tensor]) -> list[torch.Tensor]:
    body = SUBGRAPHS[body_key]
    out: list[torch.Tensor] = []
    for i in range(xs[0].shape[0]):
        step = body(*[x[i] for x in xs], *args)
        out = out or _stacked(body, 0, xs[0].shape[0], step)
        for buf, t in zip(out, step, strict=True):
            buf[i].copy_(t)
    return out


def _scan(body_key: str, init: list[torch.Tensor], xs: list[torch.Tensor],
          additional: list[torch.Tensor]) -> list[torch.Tensor]:
    body = SUBGRAPHS[body_key]
    carry, ys = list(init), []
    for i in range(xs[0].shape[0]):
        step = body(*carry, *[x[i] for x in xs], *additional)
        carry, y = step[:len(init)], step[len(init):]
        ys = ys or _stacked(body, len(init), xs[0].shape[0], y)
        for buf, t in zip(ys, y, strict=True):
            buf[i].copy_(t)
    return [*_fresh(carry, [*init, *xs, *additional], body), *ys]


def _cond_fake(pred, true_key, false_key, operands):
    return list(SUBGRAPHS[true_key].gm(*operands))


def _while_loop_fake(cond_key, body_key, carried, additional):
    return [torch.empty_like(t) for t in carried]


def _map_fake(body_key, xs, args):
    step = SUBGRAPHS[body_key].gm(*[x[0] for x in xs], *args)
    return [t.new_empty((xs[0].shape[0], *t.shape)) for t in step]


def _scan_fake(body_key, init, xs, additional):
    step = SUBGRAPHS[body_key].gm(*init, *[x[0] for x in xs], *additional)
    return [*[torch.empty_like(t) for t in step[:len(init)]],
            *[t.new_empty((xs[0].shape[0], *t.shape)) for t in step[len(init):]]]


for _name, _impl, _fake in (("cond", _cond, _cond_fake),
                            ("while_loop", _while_loop, _while_loop_fake),
                            ("map", _map, _map_fake),
                            ("scan", _scan, _scan_fake)):
    _lib.impl(_name, _impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"kiln_hop::{_name}", _fake, lib=_lib)


def _meta() -> Any:
    node = current().current_node
    return node.meta.get("val", node.meta.get("example_value"))


@lowering(torch.ops.higher_order.cond)
def cond(pred, true_gm, false_gm, operands):
    if not isinstance(true_gm, torch.fx.GraphModule) or not isinstance(false_gm,
                                                                         torch.fx.GraphModule):
        raise LoweringError("cond with branches that are not GraphModules")
    meta = _meta()
    keys = [_compile_body(true_gm, "cond_true", meta), _compile_body(false_gm, "cond_false", meta)]
    return make_extern(torch.ops.kiln_hop.cond.default, [pred, *keys, list(operands)], {}, meta)


@lowering(torch.ops.higher_order.while_loop)
def while_loop(cond_gm, body_gm, carried, additional):
    meta = _meta()
    keys = [_compile_body(cond_gm, "while_cond", None if meta is None else []),
            _compile_body(body_gm, "while_body", meta)]
    return make_extern(torch.ops.kiln_hop.while_loop.default,
                       [*keys, list(carried), list(additional)], {}, meta)


@lowering(torch.ops.higher_order.map_impl)
def map_impl(body_gm, xs, args):
    meta = _meta()
    key = _compile_body(body_gm, "map_body", meta)
    return make_extern(torch.ops.kiln_hop.map.default, [key, list(xs), list(args)], {}, meta)


@lowering(torch.ops.higher_order.scan)
def scan(combine_gm, init, xs, additional):
    meta = _meta()
    key = _compile_body(combine_gm, "scan_combine", meta)
    return make_extern(torch.ops.kiln_hop.scan.default,
                       [key, list(init), list(xs), list(additional)], {}, meta)


# ------------------------------------------------------------------------------- flex_attention
# A flex_attention node reaches loopir only where the fused kernel was chosen for it (aotgrad's
# rule keeps the operator, ``kiln_aotgrad.flex_attention``; elsewhere the rule writes it as
# dense ATen math). Its kernel is built, when the node is lowered, by the compiler the full
# stack installs (``set_flex_attention_compiler``: codegen-triton's template), registered by
# key, and run by one extern call of ``kiln_hop::flex_attention``.

#: (score_mod GraphModule, mask_mod GraphModule, score tables, mask tables, query, key,
#: value: example tensors) -> callable(query, key, value, kv_num, kv_idx, full_num, full_idx,
#: q_block, kv_block, scale, score_tables, mask_tables) -> (out, lse, max); with
#: ``backward=True``, (score_mod, joint, mask_mod GraphModules, the same examples) -> the
#: backward kernel: callable(query, key, value, out, lse, grad_out, grad_lse, the BlockMask's
#: kv and q block lists, q_block, kv_block, scale, score_tables, mask_tables) -> (dq, dk, dv)
_flex_compiler: list[Callable] = []

#: key (in the wrapper's source) -> compiled flex_attention kernel
FLEX_KERNELS: dict[str, Callable] = {}


@dataclass(frozen=True)
class FlexAttentionTemplate:
    """A codegen's fused FlexAttention kernels: ``unsupported(query, key, value, (q_block,
    kv_block))`` says why it does not take a call (None: it does); ``build(score_gm, mask_gm,
    score_tables, mask_tables, query, key, value)`` returns the forward kernel (called as the
    ``kiln_hop::flex_attention`` extern calls it); ``build_backward(score_gm, joint_gm,
    mask_gm, score_tables, mask_tables, query, key, value)`` the backward's
    (``kiln_hop::flex_attention_backward``), or None where there is none;
    ``build_decode`` (as ``build``) a forward for short queries, or None."""

    unsupported: Callable[..., str | None]
    build: Callable[..., Callable]
    build_backward: Callable[..., Callable] | None = None
    build_decode: Callable[..., Callable] | None = None


#: codegen name -> its template (a codegen registers its own when it is imported)
FLEX_ATTENTION_TEMPLATES: dict[str, FlexAttentionTemplate] = {}


def register_flex_attention_template(codegen: str, template: FlexAttentionTemplate) -> None:
    if codegen in FLEX_ATTENTION_TEMPLATES:
        raise ValueError(f"codegen {codegen!r} already has a FlexAttention template")
    FLEX_ATTENTION_TEMPLATES[codegen] = template


def set_flex_attention_compiler(fn: Callable) -> None:
    """Install how a flex_attention node's kernel is built (the last one installed is used)."""
    _flex_compiler.append(fn)


_lib.define("flex_attention(str key, Tensor query, Tensor key_, Tensor value, Tensor kv_num, "
            "Tensor kv_idx, Tensor? full_num, Tensor? full_idx, int q_block, int kv_block, "
            "float scale, Tensor[] score_tables, Tensor[] mask_tables, SymInt[] out_stride) "
            "-> (Tensor, Tensor, Tensor)")


def _flex_outputs(query, value, out_stride):
    B, H, L = query.shape[:3]
    out = query.new_empty_strided((B, H, L, value.shape[-1]), out_stride)
    return (out, query.new_empty((B, H, L), dtype=torch.float32),
            query.new_empty((B, H, L), dtype=torch.float32))


def _flex_attention(key, query, key_, value, kv_num, kv_idx, full_num, full_idx, q_block,
                    kv_block, scale, score_tables, mask_tables, out_stride):
    out, lse, mx = FLEX_KERNELS[key](query, key_, value, kv_num, kv_idx, full_num, full_idx,
                                     q_block, kv_block, scale, score_tables, mask_tables)
    if tuple(out.stride()) != tuple(out_stride):
        out = _flex_outputs(query, value, out_stride)[0].copy_(out)
    return out, lse, mx


def _flex_attention_fake(key, query, key_, value, kv_num, kv_idx, full_num, full_idx, q_block,
                         kv_block, scale, score_tables, mask_tables, out_stride):
    return _flex_outputs(query, value, out_stride)


_lib.impl("flex_attention", _flex_attention, "CompositeExplicitAutograd")
torch.library.register_fake("kiln_hop::flex_attention", _flex_attention_fake, lib=_lib)


def _example_of(x: Any) -> Any:
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else x


@lowering(torch.ops.higher_order.flex_attention)
def flex_attention(query, key, value, score_gm, block_mask, scale, kernel_options,
                   score_tables=(), mask_tables=()):
    if not _flex_compiler:
        raise LoweringError("flex_attention without a kernel compiler installed (the full "
                            "stack installs codegen-triton's)")
    mask_gm = block_mask[-1]
    if not isinstance(score_gm, torch.fx.GraphModule) or not isinstance(mask_gm,
                                                                         torch.fx.GraphModule):
        raise LoweringError("flex_attention with mods that are not GraphModules")
    node = current().current_node
    q_val, k_val, v_val = (_example_of(a) for a in node.args[:3])
    score_vals = [_example_of(a) for a in node.args[7]] if len(node.args) > 7 else []
    mask_vals = [_example_of(a) for a in node.args[8]] if len(node.args) > 8 else []
    kernel = _flex_compiler[-1](score_gm, mask_gm, score_vals, mask_vals, q_val, k_val, v_val)
    flex_key = f"flex_attention_{next(_keys)}"
    FLEX_KERNELS[flex_key] = kernel
    meta = _meta()
    out_stride = [current().expr(s) for s in meta[0].stride()]
    kv_num, kv_idx, full_num, full_idx = block_mask[2:6]
    return make_extern(torch.ops.kiln_hop.flex_attention.default,
                       [flex_key, query, key, value, kv_num, kv_idx, full_num, full_idx,
                        int(block_mask[-3]), int(block_mask[-2]), float(scale),
                        list(score_tables), list(mask_tables), out_stride], {}, meta)


_lib.define("flex_attention_backward(str key, Tensor query, Tensor key_, Tensor value, "
            "Tensor out, Tensor lse, Tensor grad_out, Tensor? grad_lse, Tensor kv_num, "
            "Tensor kv_idx, Tensor? full_kv_num, Tensor? full_kv_idx, Tensor q_num, Tensor q_idx, "
            "Tensor? full_q_num, Tensor? full_q_idx, int q_block, int kv_block, float scale, "
            "Tensor[] score_tables, Tensor[] mask_tables, SymInt[] strides) -> Tensor[]")


def _flex_backward_outputs(query, key_, value, score_tables, strides):
    """Empty (dq, dk, dv) in the node's layouts (``strides``: 4 per result), then zeros for
    the captured tables' gradients (none is needed where this kernel was chosen)."""
    outs = [t.new_empty_strided(t.shape, strides[4 * i:4 * i + 4])
            for i, t in enumerate((query, key_, value))]
    return outs + [torch.zeros_like(t, memory_format=torch.contiguous_format)
                   for t in score_tables]


def _flex_attention_backward(key, query, key_, value, out, lse, grad_out, grad_lse, kv_num,
                             kv_idx, full_kv_num, full_kv_idx, q_num, q_idx, full_q_num,
                             full_q_idx, q_block, kv_block, scale, score_tables, mask_tables,
                             strides):
    grads = FLEX_KERNELS[key](query, key_, value, out, lse, grad_out, grad_lse, kv_num, kv_idx,
                              full_kv_num, full_kv_idx, q_num, q_idx, full_q_num, full_q_idx,
                              q_block, kv_block, scale, score_tables, mask_tables)
    outs = _flex_backward_outputs(query, key_, value, score_tables, strides)
    for i, g in enumerate(grads):
        if tuple(g.stride()) == tuple(outs[i].stride()):
            outs[i] = g
        else:
            outs[i].copy_(g)
    return outs


def _flex_attention_backward_fake(key, query, key_, value, out, lse, grad_out, grad_lse, kv_num,
                                  kv_idx, full_kv_num, full_kv_idx, q_num, q_idx, full_q_num,
                                  full_q_idx, q_block, kv_block, scale, score_tables, mask_tables,
                                  strides):
    return _flex_backward_outputs(query, key_, value, score_tables, strides)


_lib.impl("flex_attention_backward", _flex_attention_backward, "CompositeExplicitAutograd")
torch.library.register_fake("kiln_hop::flex_attention_backward", _flex_attention_backward_fake,
                            lib=_lib)


@lowering(torch.ops.higher_order.flex_attention_backward)
def flex_attention_backward(query, key, value, out, lse, grad_out, grad_lse, fw_gm, joint_gm,
                            block_mask, scale, kernel_options, score_tables=(), mask_tables=()):
    if not _flex_compiler:
        raise LoweringError("flex_attention_backward without a kernel compiler installed")
    mask_gm = block_mask[-1]
    if not all(isinstance(g, torch.fx.GraphModule) for g in (fw_gm, joint_gm, mask_gm)):
        raise LoweringError("flex_attention_backward with mods that are not GraphModules")
    node = current().current_node
    q_val, k_val, v_val = (_example_of(a) for a in node.args[:3])
    score_vals = [_example_of(a) for a in node.args[12]] if len(node.args) > 12 else []
    mask_vals = [_example_of(a) for a in node.args[13]] if len(node.args) > 13 else []
    kernel = _flex_compiler[-1](fw_gm, joint_gm, mask_gm, score_vals, mask_vals, q_val, k_val,
                                v_val, backward=True)
    flex_key = f"flex_attention_backward_{next(_keys)}"
    FLEX_KERNELS[flex_key] = kernel
    meta = _meta()
    dq, dk, dv, table_grads = meta
    flat = [dq, dk, dv, *table_grads]
    strides = [current().expr(s) for t in (dq, dk, dv) for s in t.stride()]
    outs = make_extern(torch.ops.kiln_hop.flex_attention_backward.default,
                       [flex_key, query, key, value, out, lse, grad_out, grad_lse,
                        *block_mask[2:10], int(block_mask[-3]), int(block_mask[-2]),
                        float(scale), list(score_tables), list(mask_tables), strides], {}, flat)
    return (outs[0], outs[1], outs[2], tuple(outs[3:]))
