"""``MyFunction.apply(...)`` of a user's ``torch.autograd.Function`` with grad mode on: its
``forward`` and its ``backward`` are traced as two subgraphs and the call is one node,

    autograd_function_apply(fwd_graph, bwd_graph, layout, *tensors)

whose autograd rule is the user's backward: at run time (eagerly, or under aotgrad's make_fx,
which traces it into the joint graph) the node is an ``autograd.Function`` whose forward runs
``fwd_graph`` and saves what the user's forward saved, and whose backward runs ``bwd_graph``.

- ``fwd_graph(*tensor args, *lifted)`` returns the forward's tensors, then the saved ones
  (``ctx.save_for_backward`` and tensor attributes of ctx);
- ``bwd_graph(*grad per tensor output, *saved, *lifted)`` returns a gradient per tensor input
  the backward gives one for (``layout`` says which);
- ctx attributes that are Python constants are read as constants by the backward's trace;
  ``ctx.needs_input_grad`` is known; non-tensor outputs are constants of the trace;
- a new-style Function (``forward(*args)`` and ``setup_context(ctx, inputs, output)``): the
  forward and then setup_context are traced into the one forward subgraph.

A backward marked ``once_differentiable``, one that cannot be traced, ``mark_dirty`` (an in-place
forward) and ``set_materialize_grads`` are graph breaks naming the Function: it then runs in
Python, as eager runs it.
"""

from __future__ import annotations

from typing import Any

import torch

from ...exc import Unsupported
from ..variables.base import NotConstant, VariableTracker
from ..variables.constant import ConstantVariable
from ..variables.containers import BaseSequenceVariable, TupleVariable
from ..variables.tensor import TensorVariable
from . import HigherOrderOp, register
from .subgraph import finish, fresh_input, install, node_inputs, trace_body


class _AutogradFunctionApply(torch.autograd.Function):
    """The traced forward and backward as one Function. Written with ``setup_context`` so
    that it composes with torch.func transforms (aotgrad traces under ``functionalize``):
    the forward graph's saved values leave ``forward`` as extra, non-differentiable outputs,
    which ``autograd_function_apply`` drops."""

    @staticmethod
    def forward(fwd, bwd, layout, *args):
        n_in, n_fwd_lifted, n_out = layout[0], layout[1], layout[2]
        outs = tuple(fwd(*args[:n_in + n_fwd_lifted]))
        return (*outs[:n_out], *[o.detach() for o in outs[n_out:]])

    @staticmethod
    def setup_context(ctx, inputs, output):
        fwd, bwd, layout, *args = inputs
        n_in, n_fwd_lifted, n_out = layout[0], layout[1], layout[2]
        ctx.bwd, ctx.layout, ctx.num_args = bwd, layout, len(args)
        ctx.save_for_backward(*output[n_out:], *args[n_in + n_fwd_lifted:])
        ctx.mark_non_differentiable(*[output[i] for i in layout[4]], *output[n_out:])

    @staticmethod
    def backward(ctx, *grads):
        layout = ctx.layout
        grads_out = ctx.bwd(*grads[:layout[2]], *ctx.saved_tensors)
        grads_out = grads_out if isinstance(grads_out, (tuple, list)) else (grads_out,)
        it = iter(grads_out)
        per_input = [next(it) if has else None for has in layout[3]]
        return (None, None, None, *per_input, *[None] * (ctx.num_args - len(per_input)))


def autograd_function_apply(fwd: torch.fx.GraphModule, bwd: torch.fx.GraphModule,
                            layout: tuple, *args: torch.Tensor) -> tuple:
    """The node's target. ``layout``: (tensor inputs, forward's lifted inputs, tensor
    outputs, per tensor input whether the backward gives a grad, non-differentiable output
    positions, the Function's name)."""
    n_in, n_fwd_lifted, n_out = layout[0], layout[1], layout[2]
    if not (torch.is_grad_enabled() and any(a.requires_grad for a in args[:n_in])):
        # no gradient is recorded: the forward alone, as eager runs it (and as
        # torch.func.functionalize can trace it: it has no rule for custom Functions)
        with torch.no_grad():
            return tuple(fwd(*args[:n_in + n_fwd_lifted]))[:n_out]
    return _AutogradFunctionApply.apply(fwd, bwd, layout, *args)[:n_out]


# -- capture ----------------------------------------------------------------------------------

#: ctx methods with no effect the captured node needs to reproduce
_NO_EFFECT = ("save_for_forward",)


def _once_differentiable(fn: Any) -> bool:
    code = getattr(fn, "__code__", None)
    return (code is not None and code.co_name == "wrapper" and
            code.co_filename.replace("\\", "/").endswith("torch/autograd/function.py"))


def _uses_setup_context(cls: type) -> bool:
    base = torch.autograd.function._SingleLevelFunction
    return getattr(cls, "setup_context", None) is not getattr(base, "setup_context", None)


class ForwardCtxVariable(VariableTracker):
    """``ctx`` while the forward is traced: records what it saves and holds."""

    def __init__(self, name: str, needs_input_grad: list[bool]):
        super().__init__()
        self.name = name
        self.needs_input_grad = needs_input_grad
        self.saved: list[VariableTracker] | None = None
        self.attrs: dict[str, VariableTracker] = {}
        self.non_differentiable: list[VariableTracker] = []

    def var_getattr(self, tx, name: str) -> VariableTracker:
        if name in self.attrs:
            return self.attrs[name]
        if name == "needs_input_grad":
            return TupleVariable([ConstantVariable(b) for b in self.needs_input_grad])
        if name in ("save_for_backward", "mark_non_differentiable") + _NO_EFFECT:
            return _CtxMethod(self, name)
        raise Unsupported(f"ctx.{name} in {self.name}.forward")

    def store_attr(self, tx, name: str, value: VariableTracker) -> None:
        self.attrs[name] = value

    def record(self, name: str, args: list[VariableTracker]) -> VariableTracker:
        if name == "save_for_backward":
            self.saved = list(args)
        elif name == "mark_non_differentiable":
            self.non_differentiable.extend(args)
        return ConstantVariable(None)

    def python_type(self) -> type:
        return torch.autograd.function.FunctionCtx

    def reconstruct(self, codegen: Any):
        raise Unsupported(f"{self.name}'s ctx outlives its forward")

    def describe(self) -> str:
        return f"ForwardCtxVariable({self.name})"


class _CtxMethod(VariableTracker):
    def __init__(self, ctx: ForwardCtxVariable, name: str):
        super().__init__()
        self.ctx, self.name = ctx, name

    def call_function(self, tx, args, kwargs) -> VariableTracker:
        if kwargs:
            raise Unsupported(f"ctx.{self.name} with keyword arguments")
        return self.ctx.record(self.name, [tx.realize(a) for a in args])


class BackwardCtxVariable(VariableTracker):
    """``ctx`` while the backward is traced: the saved tensors and attributes, as the
    backward graph's inputs or constants."""

    def __init__(self, name: str, saved: list[VariableTracker] | None,
                 attrs: dict[str, VariableTracker], needs_input_grad: list[bool]):
        super().__init__()
        self.name = name
        self.saved = saved
        self.attrs = attrs
        self.needs_input_grad = needs_input_grad

    def var_getattr(self, tx, name: str) -> VariableTracker:
        if name in self.attrs:
            return self.attrs[name]
        if name in ("saved_tensors", "saved_variables"):
            if self.saved is None:
                raise Unsupported(f"{self.name}.backward reads ctx.saved_tensors, "
                                  "which forward never saved")
            return TupleVariable(list(self.saved))
        if name == "needs_input_grad":
            return TupleVariable([ConstantVariable(b) for b in self.needs_input_grad])
        raise Unsupported(f"ctx.{name} in {self.name}.backward")

    def store_attr(self, tx, name: str, value: VariableTracker) -> None:
        raise Unsupported(f"{self.name}.backward sets ctx.{name}")

    def python_type(self) -> type:
        return torch.autograd.function.FunctionCtx

    def describe(self) -> str:
        return f"BackwardCtxVariable({self.name})"


def _no_grad():
    return torch.no_grad()


def capture_autograd_function(tx, cls: type, class_tracker: VariableTracker,
                              args: list[VariableTracker], kwargs: dict) -> VariableTracker:
    """``cls.apply(*args)`` under grad mode as one ``autograd_function_apply`` node."""
    name = cls.__qualname__
    if kwargs:
        raise Unsupported(f"{name}.apply with keyword arguments")
    backward = getattr(cls, "backward", None)
    if _once_differentiable(backward):
        raise Unsupported(f"{name}.backward is once_differentiable: it runs in Python")
    if getattr(cls, "vjp", None) is not None and cls.vjp is not backward and \
            "backward" not in cls.__dict__:
        backward = cls.vjp
    args = [tx.realize(a) for a in args]
    tensors = [a for a in args if isinstance(a, TensorVariable)]
    needs = [isinstance(a, TensorVariable) and a.example_value.requires_grad for a in args]
    ctx = ForwardCtxVariable(name, needs)
    saved_slots: list[tuple[str, Any]] = []  # ("saved", index) / ("attr", name)

    # the forward, as eager runs it: gradients off, on the Function's inputs
    fresh: list[VariableTracker] = []
    k = 0
    for a in args:
        if isinstance(a, TensorVariable):
            fresh.append(fresh_input(tx, a.example_value, k, requires_grad=False))
            k += 1
        else:
            fresh.append(a)
    forward = class_tracker.var_getattr(tx, "forward")
    what = f"{name}.forward"
    after = None
    fwd_args: list[VariableTracker] = [ctx, *fresh]
    if _uses_setup_context(cls):
        # new style: forward(*args), then setup_context(ctx, inputs, output) fills ctx, traced
        # into the same forward body (as eager runs it, under no_grad)
        setup = class_tracker.var_getattr(tx, "setup_context")
        fwd_args = list(fresh)

        def after(result):
            tx.call_function(setup, [ctx, TupleVariable(list(fresh)), result], {})

    with _no_grad():
        body = trace_body(tx, forward, fwd_args, what, num_args=len(tensors),
                          collect=lambda r: _forward_tensors(r, ctx, saved_slots, what),
                          after=after)
    out_structure = body.result
    n_out = len(_output_tensors(out_structure, what))
    nondiff = tuple(i for i, t in enumerate(_output_tensors(out_structure, what))
                    if any(t is m for m in ctx.non_differentiable))

    # the backward: one gradient per tensor output, the saved values, constant attributes
    saved_examples = body.outputs[n_out:]
    k = 0
    grads: list[VariableTracker] = []
    out_examples = body.outputs[:n_out]
    for item in _output_items(out_structure):
        if isinstance(item, TensorVariable):
            grads.append(fresh_input(tx, out_examples[k], k, requires_grad=False))
            k += 1
        else:
            grads.append(ConstantVariable(None))
    saved_in = [fresh_input(tx, ex, n_out + i, requires_grad=False)
                for i, ex in enumerate(saved_examples)]
    saved_vars: list[VariableTracker] | None = None
    if ctx.saved is not None:
        saved_vars = [ConstantVariable(None)] * len(ctx.saved)
    attrs: dict[str, VariableTracker] = {}
    for (kind, key), var in zip(saved_slots, saved_in, strict=True):
        if kind == "saved":
            saved_vars[key] = var
        else:
            attrs[key] = var
    for attr, value in ctx.attrs.items():
        if attr not in attrs:
            try:
                value.as_python_constant()
            except NotConstant:
                raise Unsupported(f"{name}: ctx.{attr} holds {value.describe()} (only tensors "
                                  "and Python constants reach the backward)") from None
            attrs[attr] = value
    bctx = BackwardCtxVariable(name, saved_vars, attrs, needs)
    bwd_fn = class_tracker.var_getattr(tx, "backward")
    grad_mask: list[bool] = []
    try:
        with _no_grad():
            bwd_body = trace_body(
                tx, bwd_fn, [bctx, *grads], f"{name}.backward", also=saved_in,
                collect=lambda r: _backward_tensors(r, args, grad_mask, name))
    except Unsupported as e:
        raise Unsupported(f"{name}.backward cannot be traced ({e}): it runs in Python") from e

    (fwd_sub,), fwd_lifted = finish(tx, [body], "AutogradFunctionForward")
    (bwd_sub,), bwd_lifted = finish(tx, [bwd_body], "AutogradFunctionBackward")
    fwd_var = install(tx, fwd_sub.gm, "autograd_fwd")
    bwd_var = install(tx, bwd_sub.gm, "autograd_bwd")
    tensor_mask = [m for a, m in zip(args, grad_mask, strict=True)
                   if isinstance(a, TensorVariable)]
    layout = (len(tensors), len(fwd_lifted), n_out, tuple(tensor_mask), nondiff, name)
    result = tx.output.create_graph_op(
        "call_function", autograd_function_apply,
        [fwd_var, bwd_var, ConstantVariable(layout), *tensors, *node_inputs(fwd_lifted),
         *node_inputs(bwd_lifted)], {})
    flat = list(result.items) if isinstance(result, BaseSequenceVariable) else [result]
    return _rebuild(out_structure, flat)


def _output_items(result: VariableTracker) -> list[VariableTracker]:
    if isinstance(result, BaseSequenceVariable):
        return list(result.items)
    return [result]


def _output_tensors(result: VariableTracker, what: str) -> list[TensorVariable]:
    # (imported here: shapes, imported first, runs kiln_frontend.symbolic's __init__, which
    # imports this module before shapes has defined SymNodeVariable)
    from ...shapes import SymNodeVariable

    out = []
    for item in _output_items(result):
        if isinstance(item, TensorVariable):
            out.append(item)
        elif isinstance(item, BaseSequenceVariable) or not (
                item.is_python_constant() or isinstance(item, SymNodeVariable)):
            raise Unsupported(f"{what} returns {item.describe()} (tensors and constants only)")
    return out


def _forward_tensors(result, ctx: ForwardCtxVariable, slots: list, what: str) -> list:
    tensors = list(_output_tensors(result, what))
    for i, v in enumerate(ctx.saved or []):
        if isinstance(v, TensorVariable):
            tensors.append(v)
            slots.append(("saved", i))
        elif not (v.is_python_constant() and v.as_python_constant() is None):
            raise Unsupported(f"{what} saves {v.describe()} for backward")
    for attr, v in ctx.attrs.items():
        if isinstance(v, TensorVariable):
            tensors.append(v)
            slots.append(("attr", attr))
    return tensors


def _backward_tensors(result, args: list, mask: list, name: str) -> list:
    items = _output_items(result)
    if len(items) != len(args):
        raise Unsupported(f"{name}.backward returns {len(items)} gradients for "
                          f"{len(args)} inputs")
    out = []
    for a, g in zip(args, items, strict=True):
        has = isinstance(g, TensorVariable) and isinstance(a, TensorVariable)
        if isinstance(g, TensorVariable) and not isinstance(a, TensorVariable):
            raise Unsupported(f"{name}.backward returns a gradient for a non-tensor input")
        if not has and not (g.is_python_constant() and g.as_python_constant() is None):
            raise Unsupported(f"{name}.backward returns {g.describe()} as a gradient")
        mask.append(has)
        if has:
            out.append(g)
    return out


def _rebuild(structure: VariableTracker, flat: list[VariableTracker]) -> VariableTracker:
    it = iter(flat)
    if isinstance(structure, TensorVariable):
        return next(it)
    items = [next(it) if isinstance(i, TensorVariable) else i for i in structure.items]
    return TupleVariable(items)


register(HigherOrderOp(
    name="autograd.Function",
    callables=(),  # reached through Function.apply (variables/autograd_function.py)
    capture=capture_autograd_function,
    fake_rule="autograd_function_apply run on fake tensors: the forward graph, in an "
              "autograd.Function (its outputs get requires_grad as eager's would)",
    autograd_rule="the node's own: an autograd.Function whose backward runs the traced "
                  "backward graph (aotgrad's make_fx traces it into the joint graph)",
    lowering="none: aotgrad traces through the node (forward graph in the forward graph, "
             "backward graph in the backward graph)",
))
