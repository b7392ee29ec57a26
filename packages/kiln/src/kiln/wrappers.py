"""What kiln's backends return around a compiled graph (``kiln.assemble``, ``kiln.aot_eager``):
the torch-level output structure, the grad-mode guard of inference graphs, the eager
fallback and the graphs that take it, and the facts about a graph that CUDA graphs need
(``kiln.reduce_overhead``).
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from .stats import counters

log = logging.getLogger("kiln")

__all__ = [
    "graph_facts",
    "out_structure",
    "restore_structure",
    "structure_restorer",
    "with_output_structure",
    "inference_only",
    "needs_autograd",
    "run_eagerly",
    "non_strided_tensors",
]


def graph_facts(aten_gm) -> dict:
    """What the CUDA-graph wrapper needs to know of a compiled graph (stored with it)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    info = aten_gm.meta.get("kiln")
    devices, data_dependent = set(), False
    for n in aten_gm.graph.nodes:
        v = n.meta.get("val")
        for t in v if isinstance(v, tuple | list) else [v]:
            if isinstance(t, torch.Tensor):
                devices.add(str(t.device))
            if t is not None and not isinstance(t, int | float | bool | str):
                try:
                    data_dependent = data_dependent or bool(free_unbacked_symbols(t))
                except Exception:
                    pass
    return {
        "devices": sorted(devices),
        "data_dependent": data_dependent,
        "mutated_inputs": list(getattr(info, "mutated_inputs", []) or []),
        "symbolic": bool(getattr(info, "symbolic", False)),
        "num_inputs": getattr(info, "num_inputs", None),
    }


def out_structure(aten_gm) -> tuple[Any, list]:
    """(pytree spec, [(is_graph_output, constant leaf)]) of the torch-level output."""
    from kiln_aotgrad.inference import _GRAPH_OUTPUT  # the template's marker of graph outputs

    info = aten_gm.meta["kiln"]
    template = [(leaf is _GRAPH_OUTPUT, None if leaf is _GRAPH_OUTPUT else leaf)
                for leaf in info.out_template]
    return info.out_spec, template


def restore_structure(out_structure, flat_outputs: Sequence) -> Any:
    spec, template = out_structure
    it = iter(flat_outputs)
    return pytree.tree_unflatten([next(it) if is_out else v for is_out, v in template], spec)


def structure_restorer(out_structure) -> Callable[[Sequence], Any]:
    """``restore_structure`` for one output structure, made once: a graph returning a plain
    tuple, list or single tensor of its outputs (no constants) gets ``tuple``, ``list`` or
    ``itemgetter(0)`` (one C call per call instead of a pytree walk)."""
    spec, template = out_structure
    if all(is_out for is_out, _ in template):
        if spec.is_leaf():
            return operator.itemgetter(0)
        if spec.type in (tuple, list) and all(spec.child(i).is_leaf()
                                               for i in range(spec.num_children)):
            return spec.type
    return functools.partial(restore_structure, out_structure)


def needs_autograd(gm, example_inputs: Sequence) -> bool:
    """True when grad mode is on and an input, or a parameter of ``gm``, requires grad: the
    result must then carry autograd history: the training path (``kiln.training``, compiled
    forward and backward graphs) handles the graph."""
    if not torch.is_grad_enabled():
        return False
    if any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        return True
    if isinstance(gm, torch.nn.Module):
        return any(p.requires_grad for p in gm.parameters())
    return False


def non_strided_tensors(gm, example_inputs: Sequence) -> str | None:
    """Why the graph runs eagerly when an input, parameter or buffer is sparse (or another
    non-strided layout): such tensors have no strides, so they never reach loopir."""
    named = [(f"input {i}", x) for i, x in enumerate(example_inputs)]
    if isinstance(gm, torch.nn.Module):
        named += [(f"parameter {n}", t) for n, t in gm.named_parameters()]
        named += [(f"buffer {n}", t) for n, t in gm.named_buffers()]
    for name, t in named:
        if isinstance(t, torch.Tensor) and t.layout is not torch.strided:
            return f"{name} is a {str(t.layout).replace('torch.', '')} tensor (only strided tensors compile)"
    return None


_warned_eager = False


def run_eagerly(gm, reason: str) -> Callable:
    """The graph's own forward, with one log line saying why (logger ``kiln``)."""
    global _warned_eager
    level = logging.INFO if _warned_eager else logging.WARNING
    _warned_eager = True
    log.log(level, "kiln: running this graph eagerly: %s", reason)
    counters["eager_fallbacks"] += 1
    counters[f"eager_fallback:{_reason_key(reason)}"] += 1
    return gm.forward


def _reason_key(reason: str) -> str:
    if "requires grad" in reason:
        return "mutated input requiring grad"
    if "share memory" in reason:
        return "mutated aliased inputs"
    if reason.startswith("loopir cannot lower"):
        return "loopir cannot lower"
    return reason.split(":")[0][:60]


def with_output_structure(aten_gm, flat_fn: Callable, *, derived_from=(), reads=()) -> Callable:
    """Wrap a callable returning the ATen graph's flat outputs so that it returns the
    torch-level graph's own structure (tuple, single tensor, nested, constants).
    ``derived_from``: tensors the compiled code holds copies of; ``reads``: tensors it reads
    in place as constants (``compile_inference`` guards both), kept on the result as
    ``.derived_from`` and ``.reads``."""
    if "kiln" not in getattr(aten_gm, "meta", {}) and not derived_from and not reads:
        return flat_fn
    if "kiln" not in getattr(aten_gm, "meta", {}):
        def compiled_graph(*args):
            return flat_fn(*args)
    else:  # the restore is chosen once (a plain tuple of outputs: ``tuple``)
        restore = structure_restorer(out_structure(aten_gm))

        def compiled_graph(*args):
            return restore(flat_fn(*args))

    compiled_graph.flat = flat_fn
    compiled_graph.aten_gm = aten_gm
    compiled_graph.derived_from = list(derived_from)
    compiled_graph.reads = list(reads)
    return compiled_graph


def inference_only(gm, compiled: Callable) -> Callable:
    """Guard a compiled inference graph: a call that needs autograd (grad mode on and an input
    or parameter requiring grad) runs ``gm`` eagerly instead, so results keep their history."""
    params_need_grad = isinstance(gm, torch.nn.Module) and any(
        p.requires_grad for p in gm.parameters()
    )

    is_grad_enabled = torch.is_grad_enabled
    inputs_returned: list[int] | None = None  # output positions that are an input, once known

    def call(*args: Any):
        nonlocal inputs_returned
        if is_grad_enabled() and (
            params_need_grad or any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        ):
            return gm(*args)
        outs = compiled(*args)
        if inputs_returned is None:
            inputs_returned = _inputs_returned(outs, args)
        if inputs_returned:
            outs = _fresh_aliases(outs, inputs_returned, args)
        return outs

    call.compiled = compiled
    return call


def _inputs_returned(outs: Any, args: Sequence) -> list[int]:
    """Positions of the outputs that are input tensors themselves: the compiled code drops
    an alias op (``x.detach()``, ``x[:]``, ``x.reshape(x.shape)``) and hands the input back,
    where eager returns a new tensor (its metadata, ``requires_grad_()`` and ``.grad`` its
    own; the graph's inputs are never its outputs: the frontend reloads those)."""
    if not isinstance(outs, (tuple, list)):
        return []
    ids = {id(a) for a in args if isinstance(a, torch.Tensor)}
    return [i for i, o in enumerate(outs) if isinstance(o, torch.Tensor) and id(o) in ids]


def _fresh_aliases(outs: Any, positions: list[int], args: Sequence) -> Any:
    """``outs`` with each of those positions' input a new tensor over the same memory."""
    fixed = list(outs)
    for i in positions:
        o = fixed[i]
        if any(o is a for a in args):
            fixed[i] = o.detach()
    return type(outs)(fixed) if isinstance(outs, tuple) else fixed
