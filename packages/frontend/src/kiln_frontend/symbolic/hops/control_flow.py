"""Control flow as operators: ``torch.cond`` and ``while_loop``, captured as torch's own
operators (``torch.ops.higher_order.cond``/``while_loop``) whose callables are subgraphs:

    cond(pred, true_graph_0, false_graph_0, (*operands, *lifted))
    while_loop(cond_graph_0, body_graph_0, (*carried,), (*additional, *lifted))

A predicate known while tracing (a Python bool, an int, a size comparison) needs no node:
the taken branch is inlined, and the guards that made the value known (the argument's
CONSTANT_MATCH, the tensor's sizes) keep it true.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._higher_order_ops.cond import cond as cond_api
from torch._higher_order_ops.while_loop import while_loop as while_loop_api

from ...exc import Unsupported
from ..variables.base import VariableTracker
from ..variables.containers import BaseSequenceVariable, ListVariable, TupleVariable
from ..variables.tensor import TensorVariable
from . import HigherOrderOp, register
from .subgraph import finish, flat_tensors, fresh_input, install, node_inputs, trace_body


def _bind(what: str, names: tuple[str, ...], args: list, kwargs: dict,
          defaults: dict[str, Any]) -> list:
    out = list(args)
    for name in names[len(args):]:
        if name in kwargs:
            out.append(kwargs.pop(name))
        elif name in defaults:
            out.append(defaults[name])
        else:
            raise Unsupported(f"{what} without argument {name!r}")
    if kwargs or len(out) > len(names):
        raise Unsupported(f"{what} with unexpected arguments")
    return out


def _tensors_of(tx, seq: Any, what: str) -> list[TensorVariable]:
    if seq is None:
        return []
    seq = tx.realize(seq)
    if not isinstance(seq, BaseSequenceVariable):
        raise Unsupported(f"{what} is {seq.describe()}, not a tuple or list of tensors")
    return flat_tensors(seq, what)


def rebuild(structure: VariableTracker, flat: list[VariableTracker]) -> VariableTracker:
    """``flat`` (the node's outputs) in the structure of one body's result."""
    it = iter(flat)

    def build(v):
        if isinstance(v, TensorVariable):
            return next(it)
        items = [build(i) for i in v.items]
        if isinstance(v, ListVariable):
            return ListVariable(items)
        return TupleVariable(items, tuple_cls=getattr(v, "python_cls", tuple))

    return build(structure)


def _items(result: VariableTracker) -> list[VariableTracker]:
    if isinstance(result, BaseSequenceVariable):
        return list(result.items)
    return [result]


# -- cond -----------------------------------------------------------------------------------


def capture_cond(tx, args, kwargs) -> VariableTracker:
    pred, true_fn, false_fn, operands = _bind(
        "torch.cond", ("pred", "true_fn", "false_fn", "operands"), args, kwargs,
        {"operands": TupleVariable([])})
    ops = _tensors_of(tx, operands, "torch.cond's operands")
    pred = tx.realize(pred)
    if not isinstance(pred, TensorVariable):
        # a Python bool or a SymBool: known now (truth_value guards a symbolic one)
        taken = true_fn if pred.truth_value(tx) else false_fn
        return tx.call_function(taken, list(ops), {})
    if pred.example_value.numel() != 1:
        raise Unsupported("torch.cond with a predicate of more than one element")
    bodies = []
    for fn, which in ((true_fn, "true"), (false_fn, "false")):
        inputs = [fresh_input(tx, t.example_value, i) for i, t in enumerate(ops)]
        bodies.append(trace_body(tx, fn, inputs, f"torch.cond's {which} branch"))
    if len(bodies[0].outputs) != len(bodies[1].outputs):
        raise Unsupported("torch.cond's branches return different numbers of tensors")
    (true_sub, false_sub), lifted = finish(tx, bodies, "CondBranch")
    t_var = install(tx, true_sub.gm, "cond_true")
    f_var = install(tx, false_sub.gm, "cond_false")
    result = tx.output.create_graph_op(
        "call_function", torch.ops.higher_order.cond,
        [pred, t_var, f_var, TupleVariable([*ops, *node_inputs(lifted)])], {})
    return rebuild(true_sub.result, _items(result))


# -- while_loop -------------------------------------------------------------------------------


def capture_while_loop(tx, args, kwargs) -> VariableTracker:
    cond_fn, body_fn, carried, additional = _bind(
        "while_loop", ("cond_fn", "body_fn", "carried_inputs", "additional_inputs"), args,
        kwargs, {"additional_inputs": TupleVariable([])})
    carried_t = _tensors_of(tx, carried, "while_loop's carried_inputs")
    extra = _tensors_of(tx, additional, "while_loop's additional_inputs")
    if not carried_t:
        raise Unsupported("while_loop without carried tensors")
    bodies = []
    for fn, which in ((cond_fn, "cond_fn"), (body_fn, "body_fn")):
        inputs = [fresh_input(tx, t.example_value, i)
                  for i, t in enumerate([*carried_t, *extra])]
        bodies.append(trace_body(tx, fn, inputs, f"while_loop's {which}",
                                 single=which == "cond_fn"))
    cond_out = bodies[0].outputs
    if len(cond_out) != 1 or cond_out[0].dtype is not torch.bool or cond_out[0].numel() != 1:
        raise Unsupported("while_loop's cond_fn must return one boolean tensor of one element")
    if len(bodies[1].outputs) != len(carried_t):
        raise Unsupported("while_loop's body_fn must return one tensor per carried input")
    for c, o in zip(carried_t, bodies[1].outputs, strict=True):
        c = c.example_value
        if c.shape != o.shape or c.dtype != o.dtype or c.device != o.device:
            raise Unsupported(f"while_loop's body_fn turns a carried {c.dtype} {tuple(c.shape)} "
                              f"into a {o.dtype} {tuple(o.shape)}")
    (cond_sub, body_sub), lifted = finish(tx, bodies, "WhileLoopBody")
    c_var = install(tx, cond_sub.gm, "while_cond")
    b_var = install(tx, body_sub.gm, "while_body")
    # the fake-tensor rule: the carried values' metadata (torch's own fake rule needs a
    # ShapeEnv, which static traces do not have)
    out = tx.output
    proxy = out.tracer.create_proxy(
        "call_function", torch.ops.higher_order.while_loop,
        (c_var.as_proxy(), b_var.as_proxy(), tuple(t.as_proxy() for t in carried_t),
         tuple(v.as_proxy() for v in [*extra, *node_inputs(lifted)])), {})
    with out.fake_mode:
        example = tuple(torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device=o.device)
                        for o in bodies[1].outputs)
    return TupleVariable(_items(out.wrap_result(proxy, example)))


register(HigherOrderOp(
    name="torch.cond",
    callables=(torch.ops.higher_order.cond, cond_api, *((torch.cond,) if torch.cond is not cond_api
                                                           else ())),
    capture=capture_cond,
    fake_rule="torch's cond on fake tensors: runs both branch subgraphs, checks their outputs "
              "agree, returns the true branch's",
    autograd_rule="torch's cond autograd rule under make_fx: a backward cond whose branches are "
                  "the branches' joint graphs (kiln_aotgrad traces it)",
    lowering="kiln_loopir.lowerings.higher_order: each branch compiled by the same pipeline, "
             "an extern call picks one at run time",
))

register(HigherOrderOp(
    name="while_loop",
    callables=(torch.ops.higher_order.while_loop, while_loop_api),
    capture=capture_while_loop,
    fake_rule="the body's outputs, which must have the carried inputs' sizes and dtypes",
    autograd_rule="none: a while_loop whose carried inputs need grad fails in aotgrad (torch "
                  "has no backward for it)",
    lowering="kiln_loopir.lowerings.higher_order: cond and body compiled by the same "
             "pipeline, the loop runs in the extern call",
))
