"""Partitioning a joint graph into a forward and a backward graph.

What crosses from the forward to the backward is what the forward *saves* (keeps alive until
the backward runs). Two partitioners, in ``PARTITIONERS``:

- ``"save_all"``: the forward computes every forward value; it saves each one the backward
  reads. The reference for comparison.
- ``"min_cut"`` (default): a minimum cut of the data-flow graph. Every node ``n`` becomes two
  vertices ``n.in -> n.out`` whose edge costs the bytes of ``n`` (cutting it = saving ``n``);
  data edges cost nothing to keep and cannot be cut (infinite); nodes that depend on a
  tangent are tied to the sink, primals and nodes that must run in the forward to the
  source. A forward node the cut leaves on the sink side is *recomputed* in the backward:
  only cheap pointwise and view ops may be (``RECOMPUTABLE``: never a matmul, convolution,
  reduction or random op), and recomputing costs ``price`` per byte of its output (an edge
  source -> ``n.in``; views cost nothing).

  What saving costs is what it adds to memory (``_cost_to_save``). The module's parameters
  and buffers (the lifted primals) and the graph's leaf inputs requiring grad are alive until
  the backward anyway (the module, autograd's AccumulateGrad hold them): saving one is free,
  so a weight is saved rather than its bf16 cast. The graph's other inputs are allocated
  already, by the caller, who usually keeps them (an earlier graph's output that the model
  returns: HF's logits into the loss graph): one costs half its bytes, so the cut saves an
  input rather than a new value of its size (the logits rather than their log-softmax).

  A forward node that no forward output depends on (a tangent-free piece of a backward
  formula: NLL's one-hot ``scatter``, GELU's derivative, a decomposed attention backward's
  ``q @ k^T``) runs once wherever it runs, so it is not tied to the source: the cut moves it
  to the backward unless saving it is cheaper than saving what it reads, as torch's
  partitioner bans recomputation only for nodes the forward needs. Random ops stay in the
  forward (they draw in eager's order).

The memory budget (``activation_memory_budget = f``, 0 < f <= 1) is a knapsack over the
recomputable candidates: save at most ``floor + f * (default - floor)`` bytes, where
``default`` is the min-cut at the default recompute price and ``floor`` the min-cut with free
recompute (the fewest bytes possible), and among those plans recompute the least. It is
solved by Lagrangian relaxation: the price per recomputed byte is the knapsack's multiplier,
found by bisection (saved bytes do not increase as the price falls, so the plans shrink
monotonically with ``f``).

Activation-checkpoint regions (``checkpoint.py``) override the op kinds: a node the region
recomputes can never be saved and costs nothing to recompute (a matmul too), so the cut falls
on what enters the region; a node a selective policy saves runs in the forward.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable

import torch
import torch.fx

from . import checkpoint
from .core_ops import CORE_OP_GROUPS
from .effects import eliminate_dead_code, runs_for_effect
from .joint import JointGraph
from .maxflow import INF, FlowNetwork

__all__ = [
    "Partition",
    "partition",
    "PARTITIONERS",
    "RECOMPUTABLE",
    "DEFAULT_RECOMPUTE_PRICE",
    "saved_bytes_of",
]

#: the recompute price of the default min-cut: recomputing a pointwise op costs as much as
#: saving this fraction of its output's bytes
DEFAULT_RECOMPUTE_PRICE = 0.1


def _ops_of(*groups: str, exclude: tuple[str, ...] = ()) -> frozenset:
    """The aten overloads listed in these CORE_OP_GROUPS (minus packets in ``exclude``)."""
    ops = set()
    for group in groups:
        for name in CORE_OP_GROUPS[group][1]:
            packet, _, overload = name.partition(".")
            op = getattr(getattr(torch.ops.aten, packet, None), overload, None)
            if op is not None and packet not in exclude:
                ops.add(op)
    return frozenset(ops)


#: ops the min-cut may recompute in the backward: pointwise, views, cheap creation ops.
#: Everything else (matmul, convolution, reductions, random ops, indexing) is never recomputed.
RECOMPUTABLE: frozenset = _ops_of(
    "pointwise, unary", "pointwise, binary and ternary", "views and layout", "creation"
)

#: views: recomputing them costs nothing (copies among the layout ops do cost)
_FREE: frozenset = _ops_of("views and layout", exclude=("clone", "_to_copy", "copy"))


@dataclasses.dataclass
class Partition:
    """A forward and a backward graph cut from one joint graph.

    - ``fw_gm``: takes the primals; returns ``(*forward_outputs, *mutated_values, *saved)``
      where ``saved`` are forward values (not primals) the backward reads;
    - ``saved_primals``: positions of primals the backward reads (passed through, not copied);
    - ``bw_gm``: takes ``(*saved, *saved_primals, *tangents)``; returns one grad per entry of
      ``grad_outputs`` that is True (the others are None: the primal reaches no output);
    - ``saved_bytes``: bytes of everything saved (forward values and primals);
    - ``added_bytes``: of those, the bytes the module does not hold anyway (module tensors
      and leaf inputs requiring grad left out): what the cut minimizes, what saving adds;
    - ``recomputed``: names of forward nodes the backward recomputes.
    """

    fw_gm: torch.fx.GraphModule
    bw_gm: torch.fx.GraphModule
    num_saved: int
    saved_primals: list[int]
    grad_outputs: list[bool]
    saved_names: list[str]
    saved_bytes: int
    recomputed: list[str]
    strategy: str
    added_bytes: int = 0

    def __str__(self) -> str:
        return (
            f"Partition({self.strategy}: saves {len(self.saved_names)} values, "
            f"{self.saved_bytes} bytes; recomputes {len(self.recomputed)} nodes)"
        )

    def report(self) -> str:
        """The partition report of the debug folder."""
        lines = [str(self), "saved:"]
        lines += [f"  {name}" for name in self.saved_names]
        lines.append("recomputed in the backward:")
        lines += [f"  {name}" for name in self.recomputed]
        return "\n".join(lines) + "\n"


PARTITIONERS: dict[str, Callable] = {}


def _partitioner(name: str):
    def register(fn):
        if name in PARTITIONERS:
            raise ValueError(f"partitioner {name!r} registered twice")
        PARTITIONERS[name] = fn
        return fn

    return register


def partition(
    joint: JointGraph, partitioner: str = "min_cut", activation_memory_budget: float = 1.0
) -> Partition:
    """Cut ``joint`` into forward and backward graphs with the named partitioner."""
    if partitioner not in PARTITIONERS:
        raise ValueError(
            f"unknown partitioner {partitioner!r}; known partitioners: {', '.join(PARTITIONERS)}"
        )
    budget = float(activation_memory_budget)
    if not 0.0 < budget <= 1.0:
        raise ValueError(f"activation_memory_budget must be in (0, 1], got {budget}")
    view = _JointView(joint)
    saved = PARTITIONERS[partitioner](view, budget)
    return _build(view, saved, partitioner)


# ---------------------------------------------------------------------------------- analysis


class _JointView:
    """The facts about a joint graph that partitioners need, computed once."""

    def __init__(self, joint: JointGraph):
        self.joint = joint
        graph = joint.gm.graph
        self.nodes = [n for n in graph.nodes if n.op != "output"]
        phs = [n for n in self.nodes if n.op == "placeholder"]
        self.primals = phs[: joint.num_primals]
        self.tangents = phs[joint.num_primals :]
        outs = list(graph.output_node().args[0])
        n_fw = joint.num_forward_outputs + len(joint.mutated_primals)
        self.fw_outputs = outs[:n_fw]
        self.grads = outs[n_fw:]
        # nodes that depend on a tangent can only run in the backward
        self.backward: set[torch.fx.Node] = set(self.tangents)
        for n in self.nodes:
            if any(a in self.backward for a in n.all_input_nodes):
                self.backward.add(n)
        # forward nodes the backward reads directly
        self.read_by_backward = {
            a
            for n in self.nodes
            if n in self.backward
            for a in n.all_input_nodes
            if a not in self.backward
        }
        self.read_by_backward |= {
            g for g in self.grads if isinstance(g, torch.fx.Node) and g not in self.backward
        }
        # nodes run for their effect (a check that raises), in the graph whose values they read
        effects = [n for n in self.nodes if n.op == "call_function" and runs_for_effect(n)]
        # nodes the forward outputs depend on: the others only feed the backward
        self.fw_live: set[torch.fx.Node] = set()
        stack = [o for o in self.fw_outputs if isinstance(o, torch.fx.Node)]
        while stack:
            n = stack.pop()
            if n not in self.fw_live:
                self.fw_live.add(n)
                stack.extend(n.all_input_nodes)
        # alive until the backward anyway: the module's tensors, leaf inputs requiring grad
        self.static = set(self.primals[: len(joint.lifted_names)])
        self.static |= {self.primals[i] for i in joint.leaf_inputs}
        # activation-checkpoint regions: forward nodes to recompute or to keep
        self.checkpoint = checkpoint.decisions(self.nodes, self.backward, self.fw_live)
        self.fw_effects = [n for n in effects if n not in self.backward]
        self.bw_effects = [n for n in effects if n in self.backward]


def saved_bytes_of(node: torch.fx.Node) -> float:
    """Bytes to keep ``node``'s value alive (symbolic sizes at their hints); INF for values
    that cannot be saved (tuples of a multi-output op: their items are saved instead)."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return _hint(val.numel()) * val.element_size()
    if isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool | int | float | bool):
        return 1
    return INF


def _hint(x) -> int:
    if isinstance(x, torch.SymInt):
        hint = x.node.hint
        return int(hint) if hint is not None else 64
    return int(x)


def _recomputable(node: torch.fx.Node) -> bool:
    if node.op == "get_attr":  # a constant: a higher-order operator's body, a trace constant
        return True
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        parent = node.args[0]
        return isinstance(parent, torch.fx.Node) and _recomputable(parent)
    if node.target in RECOMPUTABLE:
        return True
    # SymInt arithmetic on sizes (operator.mul, sym_size, ...)
    return isinstance(node.meta.get("val"), torch.SymInt | int) and not isinstance(
        node.target, torch._ops.OpOverload
    )


#: what saving one of the graph's inputs costs, per byte (module docstring)
INPUT_SAVE_COST = 0.5


def _cost_to_save(view: _JointView, node: torch.fx.Node) -> float:
    """What saving ``node`` adds to memory, as the cut counts it (module docstring)."""
    if node in view.static:
        return 0.0
    if node.op == "placeholder":
        return INPUT_SAVE_COST * saved_bytes_of(node)
    return saved_bytes_of(node)


def _recompute_cost(node: torch.fx.Node, price: float) -> float:
    if node.target in _FREE or node.target is operator.getitem or not node.all_input_nodes:
        return 0.0
    b = saved_bytes_of(node)
    return INF if b == INF else price * b


# ---------------------------------------------------------------------------- partitioners


@_partitioner("save_all")
def _save_all(view: _JointView, budget: float) -> list[torch.fx.Node]:
    return [n for n in view.nodes if n in view.read_by_backward]


@_partitioner("min_cut")
def _min_cut_with_budget(view: _JointView, budget: float) -> list[torch.fx.Node]:
    default = _min_cut(view, DEFAULT_RECOMPUTE_PRICE)
    if budget >= 1.0:
        return default
    floor = _min_cut(view, 0.0)
    b_default, b_floor = _total(view, default), _total(view, floor)
    target = b_floor + budget * (b_default - b_floor)
    # bisection on the recompute price: the largest price whose plan fits the target
    lo, hi, best = 0.0, DEFAULT_RECOMPUTE_PRICE, floor
    for _ in range(12):
        mid = (lo + hi) / 2
        plan = _min_cut(view, mid)
        if _total(view, plan) <= target:
            lo, best = mid, plan
        else:
            hi = mid
    return best


def _total(view: _JointView, saved: list[torch.fx.Node]) -> float:
    """The bytes a plan saves as the cut counts them (module tensors free)."""
    return sum(_cost_to_save(view, n) for n in saved)


def _min_cut(view: _JointView, price: float) -> list[torch.fx.Node]:
    net = FlowNetwork()
    source, sink = ("source",), ("sink",)
    fw_required = {n for n in view.fw_outputs if isinstance(n, torch.fx.Node)}
    for n in view.nodes:
        n_in, n_out = (n, "in"), (n, "out")
        if n in view.backward:
            net.add_edge(n_in, sink, INF)
            continue
        decision = view.checkpoint.get(n)
        if decision == checkpoint.RECOMPUTE and n not in fw_required:
            # inside a checkpoint region: never saved, recomputed for free (matmuls too)
            net.add_edge(n_in, n_out, INF)
        else:
            net.add_edge(n_in, n_out, _cost_to_save(view, n))
            if n not in view.fw_live and n.op == "call_function" and \
                    not checkpoint.draws_random(n):
                pass  # feeds only the backward: runs once, in either graph
            elif n.op == "placeholder" or not _recomputable(n) or n in fw_required or \
                    decision == checkpoint.SAVE:
                net.add_edge(source, n_in, INF)
            else:
                cost = _recompute_cost(n, price)
                if cost > 0:
                    net.add_edge(source, n_in, cost)
        for user in n.users:
            if user.op != "output":
                net.add_edge(n_out, (user, "in"), INF)
    for g in view.grads:  # a grad computed without any tangent (rare): backward reads it
        if isinstance(g, torch.fx.Node) and g not in view.backward:
            net.add_edge((g, "out"), sink, INF)
    side = net.min_cut(source, sink)
    grads = set(view.grads)
    # a crossing value is saved when something on the backward side reads it (a module
    # tensor's edge costs nothing, so it crosses whether or not the backward reads it)
    return [
        n
        for n in view.nodes
        if n not in view.backward and (n, "in") in side and (n, "out") not in side
        and (n in grads or any(u.op != "output" and (u, "in") not in side for u in n.users))
    ]


# --------------------------------------------------------------------------- graph building


def _build(view: _JointView, saved: list[torch.fx.Node], strategy: str) -> Partition:
    joint = view.joint
    primal_index = {p: i for i, p in enumerate(view.primals)}
    saved_values = [n for n in saved if n not in primal_index]
    saved_primals = [primal_index[n] for n in saved if n in primal_index]

    fw_gm, _ = _extract(
        joint.gm,
        inputs=view.primals,
        outputs=[*view.fw_outputs, *saved_values],
        effects=view.fw_effects,
        class_name="ForwardGraph",
    )
    grads = [g for g in view.grads if isinstance(g, torch.fx.Node)]
    bw_inputs = [*saved_values, *(view.primals[i] for i in saved_primals), *view.tangents]
    bw_gm, bw_nodes = _extract(
        joint.gm, inputs=bw_inputs, outputs=grads, effects=view.bw_effects,
        class_name="BackwardGraph", just_in_time=view.backward,
    )
    recomputed = [n.name for n in view.nodes if n in bw_nodes and n not in view.backward]
    return Partition(
        fw_gm=fw_gm,
        bw_gm=bw_gm,
        num_saved=len(saved_values),
        saved_primals=saved_primals,
        grad_outputs=[isinstance(g, torch.fx.Node) for g in view.grads],
        saved_names=[n.name for n in saved],
        saved_bytes=int(sum(saved_bytes_of(n) for n in saved)),
        recomputed=recomputed,
        strategy=strategy,
        added_bytes=int(sum(saved_bytes_of(n) for n in saved if n not in view.static)),
    )


def _copy_order(gm: torch.fx.GraphModule, needed: set[torch.fx.Node],
                anchors: set[torch.fx.Node] | None) -> list[torch.fx.Node]:
    """``needed`` in the joint graph's order, or (``anchors`` given) the anchors in that
    order, each preceded by those of its needed ancestors not placed yet (``_extract``)."""
    joint_order = [n for n in gm.graph.nodes if n in needed]
    if anchors is None:
        return joint_order
    position = {n: i for i, n in enumerate(joint_order)}
    placed: set[torch.fx.Node] = set()
    order: list[torch.fx.Node] = []
    for anchor in [n for n in joint_order if n in anchors] + joint_order:
        group: set[torch.fx.Node] = set()
        stack = [anchor]
        while stack:
            n = stack.pop()
            if n in needed and n not in placed and n not in group:
                group.add(n)
                stack.extend(n.all_input_nodes)
        order += sorted(group, key=position.__getitem__)
        placed |= group
    return order


def _extract(
    gm: torch.fx.GraphModule,
    *,
    inputs: list[torch.fx.Node],
    outputs: list[torch.fx.Node],
    effects: list[torch.fx.Node],
    class_name: str,
    just_in_time: set[torch.fx.Node] | None = None,
) -> tuple[torch.fx.GraphModule, set[torch.fx.Node]]:
    """A new graph computing ``outputs`` from ``inputs`` (which become its placeholders),
    and running ``effects`` (nodes run for their effect: a check that raises), copying the
    nodes in between in the joint graph's order. Reaching a placeholder that is
    not an input is a partitioner bug. Also returns the joint nodes it copied.

    ``just_in_time`` (the backward's own nodes): those keep the joint graph's order, and every
    other node (a recomputed forward node) is placed just before the first of them that
    reads it, as eager autograd recomputes a checkpoint region when its backward runs. In
    the joint graph's order every recomputation would come first, all the recomputed
    activations alive together when the backward starts."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in inputs:
        ph = graph.placeholder(node.name)
        ph.meta = dict(node.meta)
        env[node] = ph
    needed: set[torch.fx.Node] = set()
    stack = [o for o in outputs if isinstance(o, torch.fx.Node)] + list(effects)
    while stack:
        n = stack.pop()
        if n in needed or n in env:
            continue
        if n.op == "placeholder":
            raise AssertionError(f"{class_name} needs {n.name}, which it does not receive")
        needed.add(n)
        stack.extend(n.all_input_nodes)
    for node in _copy_order(gm, needed, just_in_time):
        env[node] = graph.node_copy(node, lambda a: env[a])
    result = tuple(env[o] if isinstance(o, torch.fx.Node) else o for o in outputs)
    out = graph.output(result)
    out.meta["val"] = tuple(
        r.meta.get("val") if isinstance(r, torch.fx.Node) else r for r in result
    )
    eliminate_dead_code(graph)
    graph.lint()
    return torch.fx.GraphModule(gm, graph, class_name=class_name), needed
