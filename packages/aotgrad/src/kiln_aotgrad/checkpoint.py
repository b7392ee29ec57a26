"""Activation-checkpoint regions in the joint graph.

The frontend tags the torch-level nodes of a ``torch.utils.checkpoint`` region with
``meta["recompute"]`` (a ``CheckpointPolicy``, or a selective policy function) and
``meta["ac_graph_id"]``. This module carries the tags through the joint trace and tells the
partitioner what each forward node must do:

- ``tagged``/``interpreted``: when a graph has tags, the traces run it through
  ``torch.fx.Interpreter`` under ``preserve_node_meta``, so make_fx copies ``recompute`` and
  ``ac_graph_id`` onto every ATen node a tagged node becomes (decompositions included);
- ``decisions``: per forward node of the joint graph, ``RECOMPUTE`` (never saved: the
  backward recomputes it from what enters the region, matmuls too) or ``SAVE`` (a selective
  policy's MUST_SAVE/PREFER_SAVE: computed in the forward and kept when the backward reads
  it). A selective policy is called here, per ATen node, as torch calls it per op
  (``policy(ctx, op, *args, **kwargs)`` on the node's fake values).

Random ops inside a region are never recomputed: their outputs are saved when the backward
needs them, so the recompute sees the forward's values. A region's output read by forward
nodes outside the region (the next region, a residual add) is an ordinary node: otherwise
adjacent regions would chain their recomputation back to the graph's inputs.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

__all__ = ["tagged", "interpreted", "run_interpreted", "decisions", "RECOMPUTE", "SAVE"]

RECOMPUTE = "recompute"
SAVE = "save"

_RECOMPUTE_POLICIES = (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE)


def tagged(gm: Any) -> bool:
    """Does ``gm`` (a GraphModule) hold a checkpoint region?"""
    graph = getattr(gm, "graph", None)
    return graph is not None and any("recompute" in n.meta for n in graph.nodes)


@contextlib.contextmanager
def interpreted(enabled: bool) -> Iterator[None]:
    """Node meta copied onto what make_fx records while a graph is interpreted."""
    if not enabled:
        yield
        return
    with fx_traceback.preserve_node_meta():
        yield


def run_interpreted(gm: torch.fx.GraphModule, *args: Any) -> Any:
    """Run ``gm`` node by node, each node's meta current while it runs."""
    return torch.fx.Interpreter(gm).run(*args)


class InterpretedModule(torch.nn.Module):
    """``gm`` as a module whose forward interprets it (for ``functional_call``)."""

    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__()
        self.inner = gm

    def forward(self, *args: Any) -> Any:
        return run_interpreted(self.inner, *args)


def _policy_decision(node: torch.fx.Node, policy: Any) -> str:
    if callable(policy) and not isinstance(policy, CheckpointPolicy):
        if not isinstance(node.target, torch._ops.OpOverload):
            return RECOMPUTE  # getitem of a multi-output op: follows its op (below)
        args, kwargs = torch.fx.node.map_arg(
            (node.args, node.kwargs), lambda a: a.meta.get("val"))
        policy = policy(SelectiveCheckpointContext(is_recompute=False), node.target,
                        *args, **kwargs)
        if isinstance(policy, bool):  # torch's older policies return bools: True = save
            policy = CheckpointPolicy.MUST_SAVE if policy else CheckpointPolicy.PREFER_RECOMPUTE
    return RECOMPUTE if policy in _RECOMPUTE_POLICIES else SAVE


def _random(node: torch.fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and \
        torch.Tag.nondeterministic_seeded in target.tags


def _forward_live(outputs: list[Any]) -> set[torch.fx.Node]:
    """Nodes the forward outputs depend on (not the tangent-free parts of backward formulas,
    such as GELU's derivative, which autograd adds untagged among the forward nodes)."""
    live: set[torch.fx.Node] = set()
    stack = [o for o in outputs if isinstance(o, torch.fx.Node)]
    while stack:
        n = stack.pop()
        if n not in live:
            live.add(n)
            stack.extend(n.all_input_nodes)
    return live


def decisions(nodes: list[torch.fx.Node], backward: set[torch.fx.Node],
              fw_outputs: list[Any]) -> dict[torch.fx.Node, str]:
    """What each tagged forward node must do (module docstring); untagged nodes are absent."""
    out: dict[torch.fx.Node, str] = {}
    if not any("recompute" in n.meta for n in nodes):
        return out
    live = _forward_live(fw_outputs)
    for n in nodes:
        if n in backward or n.op != "call_function" or "recompute" not in n.meta:
            continue
        if _random(n):
            out[n] = SAVE
            continue
        out[n] = _policy_decision(n, n.meta["recompute"])
    for n in nodes:  # a getitem follows the op whose output it picks
        if n in out and n.target is operator.getitem and n.args[0] in out:
            out[n] = out[n.args[0]]
    for n, d in list(out.items()):
        if d != RECOMPUTE:
            continue
        region = n.meta.get("ac_graph_id")
        for user in n.users:
            if user.op == "output" or user not in live:
                continue
            if "recompute" not in user.meta or user.meta.get("ac_graph_id") != region:
                del out[n]  # a region boundary: an ordinary node
                break
    return out
