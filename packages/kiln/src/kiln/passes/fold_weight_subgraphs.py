"""Compute, at compile time, the parts of an inference graph that read only weights.

In an inference graph the module's parameters and buffers are constants (``get_attr``), so
an op whose inputs are all constants gives the same tensor at every call: DeBERTa's
projections of its relative-position embeddings (``linear(rel_embeddings, W_k, b_k)``, two
GEMMs per layer, a fifth of the model's FLOPs), T5's position bias (an embedding of a
bucket table), Swin's relative position bias (a gather from the bias table). This pass runs
each such subgraph once, eagerly (the same ATen ops eager runs, so the same bits), and puts
its result in the graph as a new constant.

What folds: a *root*, a constant-valued node that a non-constant node (or the output) uses,
when its subgraph
- reads at least one of the module's tensors (a subgraph of ``arange``/``full`` alone is
  index arithmetic the kernels do for free, and a load from a table would cost more), or
  computes on the CPU in a graph of another device: DeBERTa's ``torch.tensor(mid - 1)
  .type_as(rel)`` and ``torch.sqrt(torch.tensor(d) * s)``, made on the CPU at every call and
  copied to the GPU (a copy from pageable memory waits for the GPU: the call's launches stop
  overlapping its kernels), or read by every layer's kernels as a CPU scalar, which no GPU
  kernel can load (an aten call each: the "off-device" fallback). Such a result goes to the
  graph's device when it is a 0-dim tensor only that device's ops read (the same value and
  type promotion: a 0-dim tensor is one on either device);
- does work: some op in it is not a view (a transpose of a weight is a layout, not a value);
- stays small: its result is at most ``max(4 x the bytes it reads, 1 MiB)`` (an off-device
  subgraph: any size up to the cap, its bytes were copied at every call) and at most
  64 MiB (``expand`` of a weight to the batch would otherwise become a batch-sized copy).
Random ops, ops that mutate or have effects, and ops on symbolic sizes are never constant.

The folded values are computed from the weights as they are at compile time: the caller
guards the source tensors' version counters (an in-place write compiles again), as for the
BatchNorm fold (``FoldedParams``). Each new constant's recipe, the subgraph as a small
GraphModule of its source weights, goes in ``gm.meta[RECIPES]`` (``kiln.constants``: a
graph-cache hit computes it again from the live weights).
"""

from __future__ import annotations

import logging
import operator

import torch
import torch.fx
from kiln_aotgrad.effects import runs_for_effect

from .fold_batchnorm import FoldedParams

log = logging.getLogger("kiln")

__all__ = ["FOLD_PREFIX", "RECIPES", "fold_weight_subgraphs", "recompute"]

#: the ``get_attr`` target prefix of the constants this pass adds
FOLD_PREFIX = "_kiln_weight_fold_"
#: ``gm.meta`` key: new constant's target -> (subgraph GraphModule, its sources' targets)
RECIPES = "kiln_weight_fold_recipes"
#: a folded result may be this many times the bytes its subgraph reads, or ``_SMALL_BYTES``
_GROWTH = 4
_SMALL_BYTES = 1 << 20
_MAX_BYTES = 64 << 20


def _attr_value(gm: torch.fx.GraphModule, target: str):
    obj = gm
    for atom in target.split("."):
        obj = getattr(obj, atom)
    return obj


def _constant_op(node: torch.fx.Node) -> bool:
    """Whether ``node`` may be computed once at compile time when its inputs are constants:
    a pure ATen op (or ``getitem`` of one) on concrete sizes."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in target.tags or target._schema.is_mutable:
        return False
    if runs_for_effect(node):
        return False
    val = node.meta.get("val")
    for v in (val if isinstance(val, tuple | list) else (val,)):
        if isinstance(v, torch.Tensor) and any(
                isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride())):
            return False
        if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
            return False
    return True


def _is_view(node: torch.fx.Node) -> bool:
    target = node.target
    if target is operator.getitem:
        return True
    return isinstance(target, torch._ops.OpOverload) and target.is_view


def graph_device(gm: torch.fx.GraphModule) -> torch.device | None:
    """The device a graph's inputs live on when it is not the CPU (None: a CPU graph, or
    one without tensor inputs)."""
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor) and v.device.type != "cpu":
                return v.device
    return None


def _on_cpu(nodes: list[torch.fx.Node]) -> bool:
    return any(isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].device.type == "cpu"
               for n in nodes if n.op == "call_function")


def _moves_to(root: torch.fx.Node, device: torch.device | None) -> torch.device | None:
    """``device`` when ``root`` is a 0-dim CPU tensor that only ``device``'s ops read."""
    val = root.meta.get("val")
    if (device is None or not isinstance(val, torch.Tensor) or val.device.type != "cpu"
            or val.dim() != 0):
        return None
    for u in root.users:
        v = u.meta.get("val")
        if u.op != "call_function" or not isinstance(v, torch.Tensor) or v.device != device:
            return None
    return device


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _recipe(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node], root: torch.fx.Node,
            sources: list[torch.fx.Node], device: torch.device | None = None
            ) -> tuple[torch.fx.GraphModule, tuple[str, ...]]:
    """``root``'s subgraph as a GraphModule taking its source weights (the other constants it
    reads, literals the trace made, are its own attributes), and the sources' targets;
    ``device``: its result is moved there."""
    keep = set(nodes)
    sub = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    owner = torch.nn.Module()
    for i, n in enumerate(sources):
        env[n] = sub.placeholder(f"w{i}")
    for n in gm.graph.nodes:  # graph order: topological
        if n not in keep or n in env:
            continue
        if n.op == "get_attr":
            name = f"c{len(env)}"
            owner.register_buffer(name, _attr_value(gm, n.target).detach().clone())
            env[n] = sub.get_attr(name)
        else:
            env[n] = sub.node_copy(n, lambda a: env[a])
    out = env[root]
    if device is not None:
        out = sub.call_function(torch.ops.aten._to_copy.default, (out,), {"device": device})
    sub.output(out)
    return torch.fx.GraphModule(owner, sub), tuple(n.target for n in sources)


def _fake_on(val: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The traced value ``val`` (a fake tensor) as it is on ``device``."""
    mode = getattr(val, "fake_mode", None)
    if mode is None:
        return val.to(device)
    with mode:
        return val.to(device)


def recompute(recipe: tuple, tensors) -> torch.Tensor:
    """A folded constant from its recipe and its sources' live tensors (a cache hit)."""
    sub_gm, _ = recipe
    with torch.no_grad():
        return sub_gm(*(t.detach() for t in tensors))


def fold_weight_subgraphs(gm: torch.fx.GraphModule, weights: set[str] | None = None
                          ) -> FoldedParams:
    """Fold ``gm``'s (an ATen inference graph's) weight-only subgraphs into new constants,
    in place. ``weights``: the ``get_attr`` targets that are the module's tensors (the
    others the trace made: ``torch.tensor(...)`` literals); None: all of them. Returns the
    guard: the source tensors with their versions."""
    guard = FoldedParams()
    recipes = gm.meta.setdefault(RECIPES, {})
    graph = gm.graph
    constant: dict[torch.fx.Node, bool] = {}
    for node in graph.nodes:
        if node.op == "get_attr":
            constant[node] = isinstance(_attr_value(gm, node.target), torch.Tensor)
        elif _constant_op(node):
            constant[node] = all(constant.get(a, False) for a in node.all_input_nodes)
        else:
            constant[node] = False
    roots = [n for n in graph.nodes if constant[n] and n.op == "call_function"
             and any(not constant[u] for u in n.users)]
    if not roots:
        return guard

    values: dict[torch.fx.Node, object] = {}

    def value(node: torch.fx.Node):
        if node not in values:
            if node.op == "get_attr":
                values[node] = _attr_value(gm, node.target)
            else:
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), value)
                values[node] = node.target(*args, **kwargs)
        return values[node]

    order = {n: i for i, n in enumerate(graph.nodes)}

    def subgraph(root: torch.fx.Node) -> list[torch.fx.Node]:
        """``root`` and the constants it is computed from, in graph order."""
        seen, stack = {root}, [root]
        while stack:
            for a in stack.pop().all_input_nodes:
                if a not in seen:
                    seen.add(a)
                    stack.append(a)
        return sorted(seen, key=order.__getitem__)

    folded = 0
    device = graph_device(gm)
    with torch.no_grad():
        for root in roots:
            nodes = subgraph(root)
            sources = [n for n in nodes if n.op == "get_attr"
                       and (weights is None or n.target in weights)]
            off_device = device is not None and _on_cpu(nodes)
            if (not sources and not off_device) or all(
                    _is_view(n) for n in nodes if n.op == "call_function"):
                continue
            val = root.meta.get("val")
            if not isinstance(val, torch.Tensor):
                continue
            read = sum(_nbytes(_attr_value(gm, n.target)) for n in nodes if n.op == "get_attr")
            size = _nbytes(val)
            limit = _MAX_BYTES if off_device else min(max(_GROWTH * read, _SMALL_BYTES), _MAX_BYTES)
            if size > limit:
                continue
            move = _moves_to(root, device)
            result = value(root)
            if (not isinstance(result, torch.Tensor) or result.shape != val.shape
                    or result.dtype != val.dtype):
                continue
            if result.stride() != val.stride():  # the layout the trace promised
                result = torch.empty_strided(val.shape, val.stride(), dtype=val.dtype,
                                             device=result.device).copy_(result)
            if move is not None:
                result = result.to(move)
                val = _fake_on(val, move)
            name = f"{FOLD_PREFIX}{folded}"
            gm.register_buffer(name, result.detach())
            recipes[name] = _recipe(gm, nodes, root, sources, move)
            with graph.inserting_before(root):
                attr = graph.get_attr(name)
            attr.meta["val"] = val
            root.replace_all_uses_with(attr, delete_user_cb=lambda u: not constant.get(u, True))
            for n in sources:
                t = _attr_value(gm, n.target)
                if all(t is not s for s, _ in guard.sources):
                    guard.sources.append((t, t._version))
            folded += 1
    if folded:
        for node in reversed(graph.nodes):  # the folded subgraphs' nodes nothing reads now
            if constant.get(node) and not node.users:
                graph.erase_node(node)
        gm.recompile()
        guard.folded = folded
        log.info("kiln: %d weight-only subgraphs computed at compile time", folded)
    return guard
