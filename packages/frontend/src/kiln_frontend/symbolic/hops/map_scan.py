"""torch's functional loops as operators: ``map`` (``torch._higher_order_ops.map``: ``f`` on
each slice of ``xs`` along its first dimension, results stacked) and ``scan``
(``torch._higher_order_ops.scan``: ``combine_fn(carry, x) -> (carry, y)`` along a dimension,
the last carry and the stacked ys), captured as torch's own operators:

    map_impl(map_body_0, [*xs], [*tensor args, *lifted])
    scan(scan_combine_0, [*init], [*xs moved to dim 0, flipped if reverse], (*lifted,))

The body is traced once on one step's values: a slice of each mapped tensor (its first
dimension dropped) and, for scan, the carry shaped like ``init``; pytrees (tuples and lists of
tensors) keep their structure for the user's function and are flat for the node. scan's
``dim`` and ``reverse`` are ``movedim``/``flip`` nodes around it, as torch's own ``scan``
does them. A body returning non-tensors, a carry whose sizes or dtypes change, or arguments
that are not tensors or constants break the graph naming the operator.
"""

from __future__ import annotations

import torch
from torch._higher_order_ops.map import map as map_api
from torch._higher_order_ops.scan import scan as scan_api

from ...exc import Unsupported
from ..variables.base import VariableTracker, constant_or_break
from ..variables.constant import ConstantVariable
from ..variables.containers import BaseSequenceVariable, ListVariable, TupleVariable
from ..variables.tensor import TensorVariable
from . import HigherOrderOp, register
from .control_flow import _items, rebuild
from .subgraph import finish, flat_tensors, fresh_input, install, node_inputs, trace_body

#: torch 2.13's scan moves its stacked outputs back to ``dim``; torch 2.11's leaves them along
#: dim 0 (what a capture with ``dim != 0`` must reproduce, so older releases break there)
SCAN_YS_ALONG_DIM = torch.torch_version.TorchVersion(torch.__version__) >= "2.13"


def _leaves(tx, value: VariableTracker, what: str) -> list[TensorVariable]:
    return flat_tensors(tx.realize(value), what)


def _check_length(xs: list[TensorVariable], what: str) -> None:
    if any(x.example_value.ndim == 0 for x in xs):
        raise Unsupported(f"{what} over a 0-d tensor")
    sizes = {x.example_value.shape[0] for x in xs}
    if len(sizes) != 1:
        raise Unsupported(f"{what} over tensors of different lengths {sorted(map(str, sizes))}")
    if sizes == {0}:
        raise Unsupported(f"{what} over tensors of length 0 (eager raises)")


def _step_inputs(tx, xs: list[TensorVariable], start: int) -> list[TensorVariable]:
    """One step's slice of each mapped tensor, as the body's fresh arguments."""
    with tx.output.fake_mode:
        slices = [x.example_value.select(0, 0) for x in xs]
    return [fresh_input(tx, s, start + i) for i, s in enumerate(slices)]


def _constant(value: VariableTracker, what: str):
    return constant_or_break(value, f"{what} is {value.describe()}, not a constant")


# -- map --------------------------------------------------------------------------------------


def capture_map(tx, args, kwargs) -> VariableTracker:
    if kwargs or len(args) < 2:
        raise Unsupported("map(f, xs, *args) with keyword arguments or without xs")
    f, xs, *rest = [tx.realize(a) for a in args]
    xs_t = _leaves(tx, xs, "map's xs")
    if not xs_t:
        raise Unsupported("map without tensors to map over")
    _check_length(xs_t, "map")
    for a in rest:
        if not isinstance(a, TensorVariable) and not a.is_python_constant():
            raise Unsupported(f"map's extra argument {a.describe()} (tensors and constants only)")
    pos_t = [a for a in rest if isinstance(a, TensorVariable)]
    slices = _step_inputs(tx, xs_t, 0)
    pos_in = [fresh_input(tx, a.example_value, len(slices) + j) for j, a in enumerate(pos_t)]
    it = iter(pos_in)
    call = [rebuild(xs, slices), *[next(it) if isinstance(a, TensorVariable) else a
                                   for a in rest]]
    body = trace_body(tx, f, call, "map's body", inputs=[*slices, *pos_in])
    (sub,), lifted = finish(tx, [body], "MapBody")
    var = install(tx, sub.gm, "map_body")
    result = tx.output.create_graph_op(
        "call_function", torch.ops.higher_order.map_impl,
        [var, ListVariable(list(xs_t)), ListVariable([*pos_t, *node_inputs(lifted)])], {})
    return rebuild(sub.result, _items(result))


# -- scan -------------------------------------------------------------------------------------


def _op(tx, fn, *args) -> VariableTracker:
    return tx.output.create_graph_op(
        "call_function", fn, [a if isinstance(a, VariableTracker) else ConstantVariable(a)
                              for a in args], {})


def capture_scan(tx, args, kwargs) -> VariableTracker:
    kwargs = dict(kwargs)
    dim = _constant(kwargs.pop("dim", ConstantVariable(0)), "scan's dim")
    reverse = _constant(kwargs.pop("reverse", ConstantVariable(False)), "scan's reverse")
    names = ("combine_fn", "init", "xs")
    if len(args) > len(names) or any(k not in names for k in kwargs):
        raise Unsupported("scan with unexpected arguments")
    bound = list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs]
    if len(bound) != 3:
        raise Unsupported("scan without combine_fn, init or xs")
    combine_fn, init, xs = [tx.realize(a) for a in bound]
    init_t = _leaves(tx, init, "scan's init")
    xs_t = _leaves(tx, xs, "scan's xs")
    if not xs_t:  # eager's shortcut
        return TupleVariable([init, ListVariable([])])
    if not init_t:
        raise Unsupported("scan without init tensors (eager raises)")
    if not isinstance(dim, int) or not isinstance(reverse, bool):
        raise Unsupported("scan with a dim that is not an int or reverse not a bool")
    ndim = xs_t[0].example_value.ndim
    if not -ndim <= dim < ndim:
        raise Unsupported(f"scan along dim {dim} of a {ndim}-d tensor (eager raises)")
    dim %= ndim
    if dim != 0 and not SCAN_YS_ALONG_DIM:
        raise Unsupported(f"scan along dim {dim} on torch {torch.__version__}, whose scan "
                          "stacks its outputs along dim 0 (kiln captures torch 2.13's layout)")
    moved = []
    for x in xs_t:
        if dim != 0:
            x = _op(tx, torch.movedim, x, dim, 0)
        if reverse:
            x = _op(tx, torch.flip, x, [0])
        moved.append(x)
    _check_length(moved, "scan")

    carry_in = [fresh_input(tx, t.example_value, i) for i, t in enumerate(init_t)]
    slices = _step_inputs(tx, moved, len(carry_in))
    parts: list[VariableTracker] = []

    def collect(result: VariableTracker) -> list[TensorVariable]:
        if not isinstance(result, BaseSequenceVariable) or len(result.items) != 2:
            raise Unsupported("scan's combine_fn must return (next carry, y)")
        parts.extend(result.items)
        carry = flat_tensors(result.items[0], "scan's carry")
        if len(carry) != len(init_t):
            raise Unsupported("scan's combine_fn returns another number of carried tensors")
        for c, o in zip(init_t, carry, strict=True):
            c, o = c.example_value, o.example_value
            if c.shape != o.shape or c.dtype != o.dtype:
                raise Unsupported(f"scan's combine_fn turns a carried {c.dtype} "
                                  f"{tuple(c.shape)} into a {o.dtype} {tuple(o.shape)}")
        return [*carry, *flat_tensors(result.items[1], "scan's y")]

    body = trace_body(tx, combine_fn, [rebuild(init, carry_in), rebuild(xs, slices)],
                      "scan's combine_fn", inputs=[*carry_in, *slices], collect=collect)
    (sub,), lifted = finish(tx, [body], "ScanCombine")
    var = install(tx, sub.gm, "scan_combine")
    result = _items(tx.output.create_graph_op(
        "call_function", torch.ops.higher_order.scan,
        [var, ListVariable(list(init_t)), ListVariable(moved),
         TupleVariable(node_inputs(lifted))], {}))
    n_carry = len(init_t)
    ys = []
    for y in result[n_carry:]:
        if reverse:
            y = _op(tx, torch.flip, y, [0])
        if dim != 0 and dim < y.example_value.ndim:
            y = _op(tx, torch.movedim, y, 0, dim)
        ys.append(y)
    return TupleVariable([rebuild(parts[0], result[:n_carry]), rebuild(parts[1], ys)])


register(HigherOrderOp(
    name="map",
    callables=(map_api,),  # map_impl itself (flat arguments) has no entry: a break
    capture=capture_map,
    fake_rule="torch's map_impl on fake tensors: the body on one slice, its outputs with the "
              "mapped length in front",
    autograd_rule="torch's map_impl autograd rule under make_fx (a backward map_impl of the "
                  "body's joint graph)",
    lowering="kiln_loopir.lowerings.higher_order: the body compiled by the same pipeline, the "
             "loop over the slices runs in an extern call",
))

register(HigherOrderOp(
    name="scan",
    callables=(scan_api,),  # the scan operator itself has no entry: a break
    capture=capture_scan,
    fake_rule="torch's scan on fake tensors: the combine_fn on the init and one slice, the "
              "carry and the ys stacked",
    autograd_rule="torch's scan autograd rule under make_fx (a backward scan)",
    lowering="kiln_loopir.lowerings.higher_order: the combine_fn compiled by the same "
             "pipeline, the loop runs in an extern call",
))
