"""compile_joint: trace, partition and compile a training graph; run it as one autograd node.

``compile_joint(gm, example_inputs, fw_compiler, bw_compiler)`` returns a callable with
``gm``'s signature. Each call:

- under grad mode, runs ``CompiledFunction`` (a ``torch.autograd.Function``): its forward runs
  the compiled forward graph, applies the input mutations (epilogue copies, once per call) and
  saves what the partition saves; its backward runs the compiled backward graph, so a user's
  ``loss.backward()`` runs it as one node of eager autograd. ``retain_graph=True`` works (the
  saved tensors stay); a double backward (``create_graph=True``) raises
  ``DoubleBackwardError``;
- with grad mode off (``torch.no_grad()``), runs the compiled forward alone and drops what it
  would have saved (the mutations still apply);
- when the primals' ``requires_grad`` differ from the traced ones (a frozen parameter), it
  traces and compiles again for the new pattern (one compile per pattern).

Grads of primals that reach no output the loss uses stay ``None``, as in eager.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from .inference import _GRAPH_OUTPUT
from .joint import JointGraph, trace_joint
from .partition import Partition, partition

log = logging.getLogger("kiln.aotgrad")

__all__ = ["compile_joint", "CompiledJoint", "DoubleBackwardError", "aot_eager_compiler"]


class DoubleBackwardError(RuntimeError):
    """A backward through a compiled graph was asked to build a graph of its own."""


def aot_eager_compiler(gm: torch.fx.GraphModule) -> Callable:
    """A compiler that runs an ATen graph with torch ops (the ``aot_eager`` backend's)."""
    return gm.forward


@dataclasses.dataclass
class CompiledJoint:
    """One traced, partitioned and compiled joint graph (for one requires_grad pattern)."""

    joint: JointGraph
    partition: Partition
    forward: Callable
    backward: Callable | None

    def __str__(self) -> str:
        return f"CompiledJoint({self.joint}, {self.partition})"


def compile_joint(
    gm: torch.fx.GraphModule | torch.nn.Module,
    example_inputs: Sequence,
    fw_compiler: Callable[[torch.fx.GraphModule], Callable] = aot_eager_compiler,
    bw_compiler: Callable[[torch.fx.GraphModule], Callable] = aot_eager_compiler,
    *,
    partitioner: str = "min_cut",
    activation_memory_budget: float = 1.0,
    decompositions: dict | None = None,
    on_compiled: Callable[[CompiledJoint], None] | None = None,
) -> Callable:
    """A callable with ``gm``'s signature whose forward and backward are compiled.

    ``fw_compiler``/``bw_compiler`` take an ATen graph returning a flat tuple and give a
    callable returning its flat outputs (a tuple or list). ``on_compiled`` sees each
    ``CompiledJoint`` (the kiln backend writes debug files and stats from it)."""

    def build(inputs: Sequence) -> CompiledJoint:
        joint = trace_joint(gm, inputs, decompositions=decompositions)
        part = partition(joint, partitioner, activation_memory_budget)
        compiled = CompiledJoint(
            joint=joint,
            partition=part,
            forward=fw_compiler(part.fw_gm),
            # no output carries a grad (argmax, a no_grad region...): no backward to run
            backward=bw_compiler(part.bw_gm) if any(part.grad_outputs) else None,
        )
        log.debug("compiled %s", compiled)
        if on_compiled is not None:
            on_compiled(compiled)
        return compiled

    first = build(example_inputs)
    by_pattern: dict[tuple[bool, ...], CompiledJoint] = {_pattern(first, example_inputs): first}

    def compiled_training_graph(*args):
        pattern = _pattern(first, args)
        compiled = by_pattern.get(pattern)
        if compiled is None:
            log.info("kiln.aotgrad: requires_grad of the inputs changed; tracing again")
            compiled = by_pattern[pattern] = build(list(args))
        primals = [*compiled.joint.lifted_tensors, *args]
        if torch.is_grad_enabled() and any(pattern) and compiled.backward is not None:
            flat = CompiledFunction.apply(compiled, *primals)
        else:
            flat = _forward_only(compiled, primals)
        return _restore(compiled.joint, flat)

    compiled_training_graph.compiled = first
    compiled_training_graph.by_pattern = by_pattern
    return compiled_training_graph


def _pattern(compiled: CompiledJoint, args: Sequence) -> tuple[bool, ...]:
    lifted = [t.requires_grad for t in compiled.joint.lifted_tensors]
    return tuple(lifted + [isinstance(a, torch.Tensor) and a.requires_grad for a in args])


def _restore(joint: JointGraph, flat: Sequence) -> Any:
    it = iter(flat)
    leaves = [next(it) if leaf is _GRAPH_OUTPUT else leaf for leaf in joint.out_template]
    return pytree.tree_unflatten(leaves, joint.out_spec)


def _run_forward(compiled: CompiledJoint, primals: list) -> tuple[list, list]:
    """Run the forward graph and the mutation epilogue; (forward outputs, saved values)."""
    joint = compiled.joint
    flat = list(compiled.forward(*primals))
    n_out, n_mut = joint.num_forward_outputs, len(joint.mutated_primals)
    outs, new_values, saved = flat[:n_out], flat[n_out : n_out + n_mut], flat[n_out + n_mut :]
    with torch.no_grad():
        for i, value in zip(joint.mutated_primals, new_values, strict=True):
            primals[i].copy_(value)
    return outs, saved


def _forward_only(compiled: CompiledJoint, primals: list) -> list:
    outs, _ = _run_forward(compiled, primals)
    return outs


class CompiledFunction(torch.autograd.Function):
    """Forward and backward of one compiled joint graph, as one autograd node."""

    @staticmethod
    def forward(ctx, compiled: CompiledJoint, *primals):
        outs, saved = _run_forward(compiled, list(primals))
        part = compiled.partition
        saved_primals = [primals[i] for i in part.saved_primals]
        tensors = [*saved, *saved_primals]
        ctx.save_for_backward(*[t for t in tensors if isinstance(t, torch.Tensor)])
        ctx.saved_non_tensors = [
            (i, t) for i, t in enumerate(tensors) if not isinstance(t, torch.Tensor)
        ]
        ctx.num_saved_values = len(tensors)
        ctx.compiled = compiled
        ctx.set_materialize_grads(False)
        diff = set(compiled.joint.diff_outputs)
        # outputs that are inputs (or views of them) must be fresh tensors of this node
        outs = [o.clone() if _is_input(o, primals) else o for o in outs]
        # a view of a buffer of the forward (``y.view(...)``) would be a view made inside a
        # custom Function, which autograd forbids modifying in place (``out.mul_(2)`` works
        # in eager): the same memory as a non-view, sharing the version counter, so an
        # in-place write to a saved value is still caught at backward
        outs = [o.detach() if isinstance(o, torch.Tensor) and o._is_view() else o for o in outs]
        ctx.out_meta = {i: (outs[i].shape, outs[i].dtype, outs[i].device) for i in diff}
        non_diff = [o for i, o in enumerate(outs) if i not in diff]
        if non_diff:
            ctx.mark_non_differentiable(*non_diff)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        if torch.is_grad_enabled():
            raise DoubleBackwardError(
                "kiln: a double backward (create_graph=True, or torch.autograd.grad of a "
                "grad) through a compiled training graph is not supported; compile with "
                "backend='eager' or run this part eagerly"
            )
        compiled: CompiledJoint = ctx.compiled
        joint, part = compiled.joint, compiled.partition
        tensors = list(ctx.saved_tensors)
        for i, t in ctx.saved_non_tensors:
            tensors.insert(i, t)
        tangents, got = [], set()
        for i in joint.diff_outputs:
            g = grad_outputs[i]
            if g is None:
                shape, dtype, device = ctx.out_meta[i]
                g = torch.zeros(shape, dtype=dtype, device=device)
            else:
                got.add(i)
                g = g.contiguous()
            tangents.append(g)
        grads = list(compiled.backward(*tensors, *tangents))
        result: list = [None]  # the CompiledJoint argument
        it = iter(grads)
        per_primal: dict[int, Any] = {}
        for p, present, deps in zip(
            joint.grad_primals, part.grad_outputs, joint.output_deps, strict=True
        ):
            g = next(it) if present else None
            if g is not None and not (deps & got):
                g = None  # reaches only outputs that got no grad: stays None, as in eager
            per_primal[p] = g
        result += [per_primal.get(i) for i in range(joint.num_primals)]
        return tuple(result)


def _is_input(t, primals) -> bool:
    """Does output ``t`` share memory with a primal (then it is cloned)? Dense tensors only."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
        return False
    storage = t.untyped_storage().data_ptr()
    return storage != 0 and any(
        isinstance(p, torch.Tensor)
        and p.layout == torch.strided
        and p.untyped_storage().data_ptr() == storage
        for p in primals
    )
