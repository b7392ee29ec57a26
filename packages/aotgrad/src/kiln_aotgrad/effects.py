"""Which nodes of an ATen graph run for their effect, so that dead-code elimination and the
partitioner keep them although nothing reads their value.

FX's own answer (``Node.is_impure``) differs between torch releases: torch 2.13 keeps an op
that returns nothing (``aten._linalg_check_errors``, which raises ``LinAlgError`` for a
singular matrix), torch 2.11 drops it, and then ``torch.linalg.inv`` of a singular matrix
returned garbage instead of raising. kiln decides for itself, the same on every release."""

from __future__ import annotations

import torch
import torch.fx

__all__ = ["runs_for_effect", "eliminate_dead_code"]


def runs_for_effect(node: torch.fx.Node) -> bool:
    """FX calls ``node`` impure, or it is an ATen op that returns nothing (a check that
    raises: ``_linalg_check_errors``, ``_assert_async``) or writes one of its arguments."""
    if node.is_impure():
        return True
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None:
        return False
    return not schema.returns or any(
        a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def eliminate_dead_code(graph: torch.fx.Graph) -> None:
    """``graph.eliminate_dead_code``, keeping every node that runs for its effect."""
    graph.eliminate_dead_code(is_impure_node=runs_for_effect)
