"""Activation checkpointing: ``torch.utils.checkpoint.checkpoint(fn, *args, ...)`` captured
as a region of the frame's graph.

The body is inlined (traced as any call is, same guards) and every node it added is tagged,
as torch tags its ``tag_activation_checkpoint`` regions:

- ``meta["recompute"]``: ``CheckpointPolicy.PREFER_RECOMPUTE`` for plain checkpointing, or
  the user's selective policy function (``create_selective_checkpoint_contexts(policy)``),
  which aotgrad evaluates per ATen op of the joint graph (the policy speaks ATen);
- ``meta["ac_graph_id"]``: the region's number (adjacent regions keep their boundary).

make_fx copies both fields onto the ATen nodes each tagged node becomes; aotgrad's
partitioner then recomputes the region's forward nodes in the backward (matmuls too) and
saves only what enters the region (``kiln_aotgrad/checkpoint.py``). Numerics are eager's:
the forward runs the same ops once; only what is kept alive differs.

Reentrant (``use_reentrant=True``, torch's default when unspecified) and non-reentrant forms
are captured alike; eager's reentrant form gives no gradient when no tensor argument requires
grad, so there its outputs are detached. What eager refuses (keyword arguments or a
``context_fn`` with the reentrant form) is a graph break, so eager raises it.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch.utils.checkpoint import CheckpointPolicy

from ...exc import Unsupported
from ..variables.base import KnownCallableVariable, NotConstant, VariableTracker
from ..variables.constant import ConstantVariable
from ..variables.containers import BaseSequenceVariable, ListVariable
from ..variables.functions import PartialVariable
from ..variables.misc import GetAttrVariable
from ..variables.tensor import TensorVariable
from . import HigherOrderOp, register
from .control_flow import rebuild
from .subgraph import flat_tensors

_region_ids = itertools.count(1)

#: checkpoint's own keyword arguments that change nothing compiled code computes
_IGNORED = ("preserve_rng_state", "determinism_check", "debug", "early_stop")


def _constant(v: VariableTracker | None, what: str, default: Any = None) -> Any:
    """The Python value of ``v`` (a list of operators to save is a list of known callables,
    each guarded by identity where it came from a source)."""
    if v is None:
        return default
    if isinstance(v, BaseSequenceVariable):
        items = [_constant(i, what) for i in v.items]
        return items if isinstance(v, ListVariable) else tuple(items)
    if isinstance(v, KnownCallableVariable):
        return v.fn
    if isinstance(v, GetAttrVariable) and isinstance(v.obj, KnownCallableVariable) and \
            isinstance(v.obj.fn, torch._ops.OpOverloadPacket):
        return getattr(v.obj.fn, v.name)  # torch.ops.aten.mm.default: fixed by the packet
    try:
        return v.as_python_constant()
    except NotConstant:
        raise Unsupported(f"torch.utils.checkpoint with a non-constant {what}") from None


def _policy(tx, context_fn: VariableTracker | None) -> Any:
    """PREFER_RECOMPUTE for plain checkpointing; the selective policy function otherwise."""
    if context_fn is None:
        return CheckpointPolicy.PREFER_RECOMPUTE
    context_fn = tx.realize(context_fn)
    if isinstance(context_fn, PartialVariable):
        # functools.partial(create_selective_checkpoint_contexts, policy): made in the frame
        func = _constant(context_fn.func, "context_fn")
        args = [_constant(a, "selective checkpoint policy") for a in context_fn.args]
        kwargs = {k: _constant(v, "selective checkpoint policy")
                  for k, v in context_fn.keywords.items()}
        value = functools.partial(func, *args, **kwargs)
    else:
        value = _constant(context_fn, "context_fn")  # guarded by its source (FUNCTION_MATCH)
    if value is torch_checkpoint.noop_context_fn:
        return CheckpointPolicy.PREFER_RECOMPUTE
    # the contexts are made once per compile (eager makes them per call): only the policy
    # they carry is kept, and only torch's selective contexts are understood
    contexts = value()
    fw = contexts[0] if isinstance(contexts, tuple) and len(contexts) == 2 else None
    policy = getattr(fw, "policy_fn", None)
    if not isinstance(fw, torch_checkpoint._CachingTorchDispatchMode) or policy is None:
        raise Unsupported("torch.utils.checkpoint with a context_fn other than "
                          "create_selective_checkpoint_contexts(...)")
    return policy


def capture_checkpoint(tx, args, kwargs) -> VariableTracker:
    if not args:
        raise Unsupported("torch.utils.checkpoint without a function")
    fn, *fargs = args
    kwargs = dict(kwargs)
    use_reentrant = _constant(kwargs.pop("use_reentrant", None), "use_reentrant")
    context_fn = kwargs.pop("context_fn", None)
    for name in _IGNORED:
        _constant(kwargs.pop(name, None), name)
    reentrant = True if use_reentrant is None else bool(use_reentrant)
    if reentrant and (kwargs or context_fn is not None):
        raise Unsupported("torch.utils.checkpoint(use_reentrant=True) with keyword arguments "
                          "or a context_fn (eager raises)")
    policy = _policy(tx, context_fn)
    graph = tx.output.graph
    before = set(graph.nodes)
    result = tx.call_function(fn, list(fargs), kwargs)
    region = next(_region_ids)
    for n in graph.nodes:
        if n not in before and n.op in ("call_function", "call_method", "call_module"):
            n.meta["recompute"] = policy
            n.meta["ac_graph_id"] = region
    if reentrant and not any(isinstance(a, TensorVariable) and a.example_value.requires_grad
                             for a in map(tx.realize, fargs)):
        result = _detached(tx, result)
    return result


def _detached(tx, result: VariableTracker) -> VariableTracker:
    """The reentrant form with no argument requiring grad: eager's outputs carry no grad."""
    if isinstance(result, ConstantVariable):
        return result
    tensors = flat_tensors(result, "a reentrant checkpoint's function")
    flat = [t.call_method(tx, "detach", [], {}) for t in tensors]
    return flat[0] if isinstance(result, TensorVariable) else rebuild(result, flat)


register(HigherOrderOp(
    name="torch.utils.checkpoint",
    callables=(torch_checkpoint.checkpoint,),
    capture=capture_checkpoint,
    fake_rule="none: the body is inlined into the frame's graph, its nodes tagged",
    autograd_rule="the body's own ATen ops; aotgrad's partitioner recomputes the tagged "
                  "region in the backward (kiln_aotgrad/checkpoint.py)",
    lowering="none: ordinary ATen nodes",
))
