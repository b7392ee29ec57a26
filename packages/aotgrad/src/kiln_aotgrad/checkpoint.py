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
needs them, so the recompute sees the forward's values. An op torch tags random only for its
dropout (the SDPA kernels: ``dropout_p``) is random only when that probability is not zero
(``DROPOUT_ARGUMENTS``): with it 0 it draws nothing and is recomputed like the rest of its
region, as torch's partitioner does. A region's output read by forward nodes outside the
region (the next region, a residual add) is ``SAVE`` when another region depends on it:
computed in the forward and kept when the backward reads it, never recomputed. Were it
recomputable, its recompute would cost the cut next to nothing (the region's nodes recompute
for free), so the cut would recompute it, and the next region's recompute would chain back
through every region to the graph's inputs: the backward would rebuild all activations at
once (torch keeps such outputs too, ``cleanup_recompute_tags``). The output of a region that
no later region depends on (the last block, read by the final norm) is an ordinary node: the
cut may recompute it, as torch does.
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

__all__ = [
    "tagged", "interpreted", "run_interpreted", "decisions", "draws_random", "RECOMPUTE", "SAVE",
    "DROPOUT_ARGUMENTS",
]

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


#: ops tagged ``nondeterministic_seeded`` whose only randomness is a dropout: the name of
#: its probability argument, per overload packet. With the probability 0 they draw nothing.
DROPOUT_ARGUMENTS: dict[Any, str] = {}


def _dropout_argument(packet: Any, name: str) -> None:
    if packet in DROPOUT_ARGUMENTS:
        raise ValueError(f"{packet} has a dropout argument registered twice")
    DROPOUT_ARGUMENTS[packet] = name


for _name in ("_scaled_dot_product_flash_attention_for_cpu",
              "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
              "_scaled_dot_product_cudnn_attention"):
    _packet = getattr(torch.ops.aten, _name, None)
    if _packet is not None:
        _dropout_argument(_packet, "dropout_p")


def _argument(node: torch.fx.Node, name: str) -> Any:
    """The value of ``node``'s argument ``name`` (positional, keyword or the default)."""
    for i, arg in enumerate(node.target._schema.arguments):
        if arg.name == name:
            if not arg.kwarg_only and i < len(node.args):
                return node.args[i]
            return node.kwargs.get(name, arg.default_value)
    raise KeyError(f"{node.target} has no argument {name!r}")


def draws_random(node: torch.fx.Node) -> bool:
    """Does ``node`` draw random numbers (a tagged op, unless its dropout is 0)?"""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or \
            torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    dropout = DROPOUT_ARGUMENTS.get(target.overloadpacket)
    return dropout is None or _argument(node, dropout) != 0


def decisions(nodes: list[torch.fx.Node], backward: set[torch.fx.Node],
              live: set[torch.fx.Node]) -> dict[torch.fx.Node, str]:
    """What each tagged forward node must do (module docstring); untagged nodes are absent.
    ``live``: the nodes the forward outputs depend on (not the tangent-free parts of backward
    formulas, such as GELU's derivative, which autograd adds untagged among the forward
    nodes)."""
    out: dict[torch.fx.Node, str] = {}
    if not any("recompute" in n.meta for n in nodes):
        return out
    for n in nodes:
        if n in backward or n.op != "call_function" or "recompute" not in n.meta:
            continue
        if draws_random(n):
            out[n] = SAVE
            continue
        out[n] = _policy_decision(n, n.meta["recompute"])
    for n in nodes:  # a getitem follows the op whose output it picks
        if n in out and n.target is operator.getitem and n.args[0] in out:
            out[n] = out[n.args[0]]
    downstream = _regions_downstream(nodes, live)
    for n, d in list(out.items()):
        if d != RECOMPUTE:
            continue
        region = n.meta.get("ac_graph_id")
        for user in n.users:
            if user.op == "output" or user not in live:
                continue
            if "recompute" not in user.meta or user.meta.get("ac_graph_id") != region:
                if downstream[n] - {region}:
                    out[n] = SAVE  # a region boundary that another region depends on
                else:
                    del out[n]  # the last region's output: an ordinary node
                break
    return out


def _regions_downstream(nodes: list[torch.fx.Node],
                        live: set[torch.fx.Node]) -> dict[torch.fx.Node, frozenset]:
    """Per forward node, the checkpoint regions of the live nodes that depend on it."""
    empty: frozenset = frozenset()
    below: dict[torch.fx.Node, frozenset] = {}
    for n in reversed(nodes):
        regions = empty
        for user in n.users:
            if user in live:
                regions = regions | below.get(user, empty)
                if "recompute" in user.meta:
                    regions = regions | {user.meta.get("ac_graph_id")}
        below[n] = regions
    return below
