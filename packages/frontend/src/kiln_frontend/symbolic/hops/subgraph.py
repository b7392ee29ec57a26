"""Subgraph capture: a callable argument of a higher-order operator traced as its own FX
graph.

The callable is inlined into the frame's graph as any call is (same translator, same guards,
same trackers), between a mark and the end of the graph; then the nodes it added are cut out
into a graph of their own:

- its explicit arguments are fresh nodes made before the call (``subgraph_input``), which
  become the subgraph's first placeholders;
- every value of the outer graph it read (a closed-over tensor, a parameter, a graph input)
  becomes a further placeholder, "lifted": the operator's node passes it in. Such values
  were guarded when the trace first met them, as anywhere else;
- ``get_attr`` nodes, and size arithmetic on outer values only, move to the outer graph
  (a parameter read in a branch is the outer graph's, lifted like any other value).

What the callable may not do, each a graph break that names it: change Python state that
outlives it (attribute and global stores, closure cells, containers of the caller: every
branch is traced, so such a change would happen for branches eager never runs), write into
one of its inputs in place, return anything but tensors, or call a leaf module.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from ...exc import Unsupported
from ..variables.base import VariableTracker
from ..variables.constant import ConstantVariable
from ..variables.containers import BaseSequenceVariable, ConstDictVariable
from ..variables.tensor import TensorVariable


def subgraph_input(index: int) -> None:
    """Target of the stand-in node of a subgraph's explicit argument while its body is
    traced; never left in a graph (it becomes a placeholder)."""
    raise AssertionError("subgraph_input is a tracing stand-in, never run")


@dataclasses.dataclass
class TracedBody:
    """One callable traced and cut out of the outer graph (before lifted inputs are
    shared with its sibling bodies: ``finish``)."""

    graph: torch.fx.Graph  # placeholders: explicit args, then ``lifted`` in order
    num_args: int
    lifted: list[torch.fx.Node]  # outer-graph nodes it reads
    result: VariableTracker  # what the callable returned (its tensors are the outputs)
    outputs: list[Any]  # flat example values of the outputs


@dataclasses.dataclass
class Subgraph:
    """A traced callable as the operator's node sees it: ``gm`` takes
    ``(*explicit args, *lifted)`` and returns a flat tuple of tensors."""

    gm: torch.fx.GraphModule
    outputs: list[Any]
    result: VariableTracker


def fresh_input(tx, example: torch.Tensor, index: int, *,
                requires_grad: bool | None = None) -> TensorVariable:
    """A tracker for a subgraph's explicit argument shaped like ``example`` (a new value,
    not the operand itself: the body sees its parameter, not the caller's tensor)."""
    out = tx.output
    with out.fake_mode:
        fake = torch.empty_strided(example.shape, example.stride(), dtype=example.dtype,
                                   device=example.device)
    rg = example.requires_grad if requires_grad is None else requires_grad
    if rg and fake.dtype.is_floating_point:
        fake.requires_grad_(True)
    proxy = out.tracer.create_proxy("call_function", subgraph_input, (index,), {})
    proxy.node.meta["example_value"] = fake
    return TensorVariable(proxy, fake)


def _python_state(tx, extra: Sequence[VariableTracker]) -> Any:
    """What the body could change in Python state that outlives it, as comparable data."""
    se = tx.output.side_effects
    containers: dict[int, Any] = {}

    def visit(v, depth=0):
        if depth > 3 or not isinstance(v, VariableTracker):
            return
        if isinstance(v, (BaseSequenceVariable, ConstDictVariable)) and id(v) not in containers:
            items = v.items
            containers[id(v)] = ([(k, id(x)) for k, x in items.items()]
                                 if isinstance(items, dict) else [id(x) for x in items])
            for x in (items.values() if isinstance(items, dict) else items):
                visit(x, depth + 1)

    frames, t = [], tx
    while t is not None:
        frames.append((id(t), {k: id(v) for k, v in t.symbolic_locals.items()}))
        for v in [*t.symbolic_locals.values(), *t.stack]:
            visit(v)
        t = getattr(t, "parent", None)
    for v in extra:
        visit(v)
    for v in list(tx.output.source_cache.values()):
        visit(v)
    return (
        {k: {n: id(x) for n, x in e.stores.items()} for k, e in se.attr_mutations.items()},
        {k: id(v) for k, v in se.global_stores.items()},
        {k: id(v) for k, (_, v) in se.cell_stores.items()},
        frames, containers,
    )


def flat_tensors(value: VariableTracker, what: str) -> list[TensorVariable]:
    """The tensors of a body's result (a tensor, or tuples/lists of them)."""
    if isinstance(value, TensorVariable):
        return [value]
    if isinstance(value, BaseSequenceVariable):
        return [t for item in value.items for t in flat_tensors(item, what)]
    raise Unsupported(f"{what} returned {value.describe()}, not tensors")


def _writes_in_place(node: torch.fx.Node) -> bool:
    if node.op not in ("call_function", "call_method"):
        return False
    if node.target is operator.setitem or node.kwargs.get("out") is not None or \
            node.kwargs.get("inplace") is True:
        return True
    if node.target in (operator.and_, operator.or_, operator.not_):  # ``a & b``: a new value
        return False
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


_VIEW_METHODS = frozenset({"view", "reshape", "transpose", "permute", "t", "unsqueeze",
                           "squeeze", "expand", "narrow", "select", "flatten", "unflatten",
                           "as_strided", "contiguous", "view_as", "unbind", "split", "chunk"})


def base_input(node: torch.fx.Node) -> torch.fx.Node | None:
    """The placeholder a value may be a view of (over-approximated along first args: a
    write through it may write that input; output_graph guards aliasing inputs with it)."""
    while node.op != "placeholder":
        first = node.args[0] if node.args else None
        if not isinstance(first, torch.fx.Node):
            return None
        node = first
    return node


def trace_body(tx, fn: VariableTracker, args: list[VariableTracker], what: str,
               kwargs: dict[str, VariableTracker] | None = None,
               num_args: int | None = None, single: bool = False,
               collect: Callable[[VariableTracker], list[TensorVariable]] | None = None,
               also: Sequence[TensorVariable] = (),
               inputs: Sequence[TensorVariable] | None = None,
               after: Callable[[VariableTracker], Any] | None = None,
               ) -> TracedBody:
    """Trace ``fn(*args, **kwargs)`` and cut its nodes out of the outer graph. The first
    ``num_args`` trackers of ``args`` (default: all) must be ``fresh_input``s made just before
    this call; they become the subgraph's first placeholders. ``single``: the subgraph returns
    its one tensor bare, not in a tuple (while_loop's cond); ``collect(result)``: the tensors
    it returns (default: the result's tensors); ``also``: further ``fresh_input``s, made after
    those of ``args``, that the body reaches another way (an autograd.Function's saved
    tensors, through ctx); ``inputs``: all the ``fresh_input``s in placeholder order, where
    ``args`` hold them inside structures (map's and scan's pytrees of tensors); ``after(result)``
    is traced into the same body right after ``fn`` (a new-style autograd.Function's
    ``setup_context``)."""
    out = tx.output
    graph = out.graph
    if inputs is not None:
        marks = [a.proxy.node for a in inputs]
    else:
        marks = [a.proxy.node for a in args if isinstance(a, TensorVariable)
                 and a.proxy.node.target is subgraph_input] + [a.proxy.node for a in also]
    num_args = len(marks) if num_args is None else num_args
    start = marks[0] if marks else None
    before = None if start is not None else _last_node(graph)
    state = _python_state(tx, [fn, *args])
    out.tracing_bodies += 1
    try:
        result = tx.call_function(fn, list(args), dict(kwargs or {}))
        if after is not None:
            after(result)
    finally:
        out.tracing_bodies -= 1
    if _python_state(tx, [fn, *args]) != state:
        raise Unsupported(f"{what} changes Python state that outlives it (attributes, "
                          "globals, closure cells or containers of its caller)")
    region = _region(graph, start, before)
    tensors = collect(result) if collect is not None else flat_tensors(result, what)
    if single and len(tensors) != 1:
        raise Unsupported(f"{what} must return one tensor")
    sub, lifted = _cut(out, region, marks[:num_args], [t.proxy.node for t in tensors], what,
                       single)
    return TracedBody(sub, num_args, lifted, result, [t.example_value for t in tensors])


def _last_node(graph: torch.fx.Graph) -> torch.fx.Node | None:
    nodes = list(graph.nodes)
    return nodes[-1] if nodes else None


def _region(graph, start, before) -> list[torch.fx.Node]:
    nodes = list(graph.nodes)
    if start is not None:
        i = nodes.index(start)
    else:
        i = 0 if before is None else nodes.index(before) + 1
    return [n for n in nodes[i:] if n.op != "placeholder"]


def _cut(out, region: list[torch.fx.Node], marks: list[torch.fx.Node],
         results: list[torch.fx.Node], what: str,
         single: bool = False) -> tuple[torch.fx.Graph, list[torch.fx.Node]]:
    """Move ``region`` into a new graph; hoist what belongs to the outer graph."""
    inside = set(region)
    # hoist get_attr nodes and size arithmetic on outer values: they stay outer values
    first = next((n for n in region if n not in marks), None)
    for n in list(region):
        if n in marks:
            continue
        outer_only = all(a not in inside for a in n.all_input_nodes)
        sizes = isinstance(n.meta.get("example_value"), (int, torch.SymInt, torch.SymBool,
                                                         torch.SymFloat))
        if n.op == "get_attr" or (outer_only and sizes and n.op != "placeholder"):
            if first is not None and n is not first:
                first.prepend(n)
            inside.discard(n)
    region = [n for n in region if n in inside]
    for n in region:
        if n.op == "call_module":
            raise Unsupported(f"{what} calls module {n.target} (a leaf module inside a "
                              "higher-order operator's body)")
    sub = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for i, m in enumerate(marks):
        ph = sub.placeholder(f"arg{i}")
        ph.meta = dict(m.meta)
        env[m] = ph
    lifted: list[torch.fx.Node] = []

    def lift(a: torch.fx.Node) -> Any:
        if a in env:
            return env[a]
        if a in inside:
            raise Unsupported(f"{what}: internal error (node {a.name} used before made)")
        ex = a.meta.get("example_value")
        if isinstance(ex, (torch.SymFloat, torch.SymBool)):
            # a Python float the frame made dynamic (automatic dynamic): operators take
            # tensors and ints only, so the body sees its value, guarded to stay so
            env[a] = float(ex) if isinstance(ex, torch.SymFloat) else bool(ex)
            return env[a]
        lifted.append(a)
        # after the other placeholders, before every computation
        last = [n for n in sub.nodes if n.op == "placeholder"]
        ctx = sub.inserting_after(last[-1]) if last else sub.inserting_before(None)
        with ctx:
            ph = sub.placeholder(f"lifted_{a.name}")
        ph.meta = dict(a.meta)
        env[a] = ph
        return ph

    for n in region:
        if n in env:
            continue
        for a in n.all_input_nodes:
            if a not in env:
                lift(a)
        env[n] = sub.node_copy(n, lambda a: env[a])
    outs = [lift(r) if r not in env else env[r] for r in results]
    sub.output(outs[0] if single else tuple(outs))
    for n in sub.nodes:
        if _writes_in_place(n):
            base = base_input(n.args[0]) if n.args and isinstance(n.args[0], torch.fx.Node) \
                else None
            if base is not None:
                raise Unsupported(f"{what} writes into its input {base.name} in place")
    for n in reversed(region):
        if n.op == "output":
            continue
        users = [u for u in n.users if u not in inside]
        if users:
            raise Unsupported(f"{what}: a value it computed escapes it ({n.name})")
        out.graph.erase_node(n)
    sub.lint()
    return sub, lifted


def finish(tx, bodies: list[TracedBody], name: str) -> tuple[list[Subgraph], list[torch.fx.Node]]:
    """Give sibling bodies one signature, ``(*explicit args, *union of lifted)`` (cond's
    branches, while_loop's cond and body), and make their GraphModules."""
    union: list[torch.fx.Node] = []
    for b in bodies:
        for n in b.lifted:
            if n not in union:
                union.append(n)
    subs = []
    for b in bodies:
        g = torch.fx.Graph()
        env: dict[torch.fx.Node, torch.fx.Node] = {}
        old = [n for n in b.graph.nodes if n.op == "placeholder"]
        for ph in old[:b.num_args]:
            env[ph] = g.placeholder(ph.name)
            env[ph].meta = dict(ph.meta)
        by_outer = dict(zip(b.lifted, old[b.num_args:], strict=True))
        for n in union:
            new = g.placeholder(f"lifted_{n.name}")
            new.meta = dict(n.meta)
            if n in by_outer:
                env[by_outer[n]] = new
        result = g.graph_copy(b.graph, env)
        g.output(result)
        gm = torch.fx.GraphModule(torch.nn.Module(), g, class_name=name)
        subs.append(Subgraph(gm, b.outputs, b.result))
    return subs, union


class SubgraphVariable(VariableTracker):
    """A captured body as an argument of the operator's node: a ``get_attr`` of the root
    in the graph, the GraphModule itself when the node runs on fake tensors."""

    def __init__(self, gm: torch.fx.GraphModule, proxy: torch.fx.Proxy):
        super().__init__()
        self.gm = gm
        self.proxy = proxy

    def as_proxy(self) -> Any:
        return self.proxy

    def as_example(self) -> Any:
        return self.gm

    def describe(self) -> str:
        return f"SubgraphVariable({self.proxy.node.target})"


def install(tx, gm: torch.fx.GraphModule, prefix: str) -> SubgraphVariable:
    """Put ``gm`` on the graph's root (a submodule) and read it with ``get_attr``."""
    name = tx.output.register_subgraph(prefix, gm)
    proxy = tx.output.tracer.create_proxy("get_attr", name, (), {})
    return SubgraphVariable(gm, proxy)


def node_inputs(lifted: list[torch.fx.Node]) -> list[VariableTracker]:
    """Trackers passing lifted outer values to the operator's node."""
    return [_NodeVariable(n) for n in lifted]


class _NodeVariable(VariableTracker):
    """An outer-graph value passed to an operator's node (its proxy and example)."""

    def __init__(self, node: torch.fx.Node):
        super().__init__()
        self.node = node

    def as_proxy(self) -> Any:
        return torch.fx.Proxy(self.node)

    def as_example(self) -> Any:
        return self.node.meta["example_value"]


def none() -> VariableTracker:
    return ConstantVariable(None)
