"""Higher-order operators of ATen graphs: ``torch.ops.higher_order.cond`` and ``while_loop``,
whose bodies are ATen GraphModules (``get_attr`` of the graph).

Each body is compiled on its own, when the node is lowered, by the subgraph compiler the full
stack installs (``set_subgraph_compiler``: kiln compiles it with the same pipeline as any
graph; without one, the body's ATen ops run eagerly). The node becomes one extern call of an
operator of the ``kiln_hop`` library that runs the compiled bodies: ``cond`` picks a branch by
the predicate's value (the one host read), ``while_loop`` runs cond and body until cond is
false. The compiled bodies live in this process (``SUBGRAPHS``, by key); a graph holding such
a call is not cacheable across processes (the full stack says so when it compiles one).

The extern's results are fresh tensors in the layouts the node's ``meta["val"]`` gives (the
kernels after it index them so): a body's result that aliases an input, or has other strides,
is copied.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
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
    """One compiled body and the layouts its results must have."""

    def __init__(self, gm: torch.fx.GraphModule, fn: Callable, strides: list):
        self.gm = gm
        self.fn = fn
        self.strides = strides  # per output: a tuple of ints, or None (any dense layout)

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        out = self.fn(*args)
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


def _compile_body(gm: torch.fx.GraphModule, kind: str, out_meta: Any) -> str:
    example = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
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


def _cond_fake(pred, true_key, false_key, operands):
    return list(SUBGRAPHS[true_key].gm(*operands))


def _while_loop_fake(cond_key, body_key, carried, additional):
    return [torch.empty_like(t) for t in carried]


for _name, _impl, _fake in (("cond", _cond, _cond_fake),
                            ("while_loop", _while_loop, _while_loop_fake)):
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
