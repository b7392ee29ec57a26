"""Graph splitting at DistributedDataParallel bucket boundaries (training under DDP).

One compiled backward is one autograd node: every parameter's grad arrives when it ends, so
DDP's reducer can only all-reduce once the whole backward is done. Split the graph where
DDP's buckets end, compile each piece on its own (each its own autograd node), and the grads
of the last piece's parameters are ready (and their bucket's all-reduce starts) while the
earlier pieces' backward still runs.

``split_at_ddp_buckets(gm, bucket_bytes)`` walks ``gm`` in order, summing the bytes of the
parameters each node uses (``get_attr``, and the parameters of ``call_module`` targets),
and starts a new piece once a piece holds ``bucket_bytes``: the rule of DDP's own bucketing
(in reverse order: the last piece's parameters fill the first bucket). Pieces compile lazily,
at their first call, with the real activations as example inputs, through the same backend.
The DDP module is found through ``DistributedDataParallel._get_active_ddp_module()``, set by
DDP's forward while it runs the wrapped (compiled) module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.fx

log = logging.getLogger("kiln")

__all__ = ["active_ddp_bucket_bytes", "split_at_ddp_buckets", "PIECE_MARK"]

#: ``GraphModule.meta`` key marking a piece (never split again)
PIECE_MARK = "kiln_ddp_piece"


def active_ddp_bucket_bytes() -> int | None:
    """The bucket size of the DDP module whose forward is running, or None outside DDP."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # torch without distributed
        return None
    ddp = DistributedDataParallel._get_active_ddp_module()
    if ddp is None:
        return None
    return int(getattr(ddp, "bucket_bytes_cap", 25 * 1024 * 1024))


def _param_bytes(gm: torch.fx.GraphModule, node: torch.fx.Node, seen: set[int]) -> int:
    if node.op == "call_module":
        params = list(gm.get_submodule(node.target).parameters())
    elif node.op == "get_attr":
        value = gm
        for atom in node.target.split("."):
            value = getattr(value, atom)
        params = [value] if isinstance(value, torch.nn.Parameter) else []
    else:
        return 0
    total = 0
    for p in params:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total


def split_at_ddp_buckets(
    gm: torch.fx.GraphModule, bucket_bytes: int, compile_piece: Callable
) -> torch.fx.GraphModule | None:
    """``gm`` split into pieces of about ``bucket_bytes`` of parameters each, every piece
    compiled by ``compile_piece(piece, example_inputs)`` at its first call; None when ``gm``
    fits one bucket, is itself a piece, or holds grad-mode switches (not split)."""
    if gm.meta.get(PIECE_MARK) or not isinstance(gm, torch.fx.GraphModule):
        return None
    if any(
        n.op == "call_function" and n.target is torch._C._set_grad_enabled for n in gm.graph.nodes
    ):
        log.info("kiln: not splitting a graph with grad-mode switches at DDP buckets")
        return None
    piece_of: dict[torch.fx.Node, int] = {}
    seen: set[int] = set()
    piece, filled = 0, 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        size = _param_bytes(gm, node, seen)
        if size and filled and filled + size > bucket_bytes:
            piece, filled = piece + 1, 0
        filled += size
        piece_of[node] = piece
    if piece == 0:
        return None
    from torch.fx.passes.split_module import split_module

    split = split_module(gm, gm, lambda n: piece_of[n], keep_original_order=True)
    names = [n.target for n in split.graph.nodes if n.op == "call_module"]
    for name in names:
        sub = getattr(split, name)
        sub.meta[PIECE_MARK] = True
        setattr(split, name, _LazyPiece(sub, compile_piece))
    log.info("kiln: graph split into %d pieces at DDP bucket boundaries", len(names))
    return split


class _LazyPiece(torch.nn.Module):
    """A piece of a split graph, compiled at its first call (real activations as examples)."""

    def __init__(self, piece: torch.fx.GraphModule, compile_piece: Callable):
        super().__init__()
        self.piece = piece
        self.compile_piece = compile_piece
        self.compiled: Callable | None = None

    def forward(self, *args):
        if self.compiled is None:
            self.compiled = self.compile_piece(self.piece, list(args))
        return self.compiled(*args)
