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
import functools
import logging
import operator
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
    plans: dict[tuple[bool, ...], _Plan] = {}
    is_grad_enabled = torch.is_grad_enabled
    lifted = first.joint.lifted_tensors
    # every input a tensor (the usual graph): the pattern is two C-level maps; a non-tensor
    # in its place (an int) fails the attribute read and takes the general path
    tensors_only = all(isinstance(x, torch.Tensor) for x in example_inputs)

    def compiled_training_graph(*args):
        pattern, tensors = None, tensors_only
        if tensors:
            try:
                pattern = (*map(_REQUIRES_GRAD, lifted), *map(_REQUIRES_GRAD, args))
            except AttributeError:
                tensors = False
        if pattern is None:
            pattern = _pattern(first, args)
        plan = plans.get(pattern)
        if plan is None:
            compiled = by_pattern.get(pattern)
            if compiled is None:
                log.info("kiln.aotgrad: requires_grad of the inputs changed; tracing again")
                compiled = by_pattern[pattern] = build(list(args))
            plan = plans[pattern] = _Plan(compiled, trains=any(pattern))
        primals = [*plan.lifted, *args]
        if plan.trains and is_grad_enabled():
            return plan.restore(_apply(plan, primals, tensors))
        return plan.restore(plan.run_forward(primals)[0])

    compiled_training_graph.compiled = first
    compiled_training_graph.by_pattern = by_pattern
    return compiled_training_graph


_REQUIRES_GRAD = operator.attrgetter("requires_grad")


def _pattern(compiled: CompiledJoint, args: Sequence) -> tuple[bool, ...]:
    lifted = [t.requires_grad for t in compiled.joint.lifted_tensors]
    return tuple(lifted + [isinstance(a, torch.Tensor) and a.requires_grad for a in args])


def _restorer(joint: JointGraph) -> Callable[[Sequence], Any]:
    """The torch-level output structure from the flat outputs, chosen once: a plain tuple of
    outputs is ``tuple`` (one C call), a single tensor its first output; anything else (nested,
    constants among the outputs) the pytree walk."""
    spec, template = joint.out_spec, joint.out_template
    if all(leaf is _GRAPH_OUTPUT for leaf in template):
        if spec.is_leaf():
            return operator.itemgetter(0)
        if spec.type is tuple and all(spec.child(i).is_leaf() for i in range(spec.num_children)):
            return tuple
    return functools.partial(_restore, joint)


def _restore(joint: JointGraph, flat: Sequence) -> Any:
    it = iter(flat)
    leaves = [next(it) if leaf is _GRAPH_OUTPUT else leaf for leaf in joint.out_template]
    return pytree.tree_unflatten(leaves, joint.out_spec)


class _Plan:
    """What every call of one ``CompiledJoint`` needs, worked out once instead of per call:
    where the forward's flat outputs split, which outputs are differentiable, the route of
    each backward output to its primal, the shapes of zero grads, and (after the first call)
    which outputs can share memory with an input."""

    def __init__(self, compiled: CompiledJoint, trains: bool):
        joint, part = compiled.joint, compiled.partition
        self.compiled = compiled
        self.lifted = joint.lifted_tensors
        self.forward, self.backward = compiled.forward, compiled.backward
        #: whether a call under grad mode runs the autograd node (else the forward alone)
        self.trains = trains and compiled.backward is not None
        self.restore = _restorer(joint)
        self.n_out = joint.num_forward_outputs
        self.n_flat = self.n_out + len(joint.mutated_primals)
        self.mutated = joint.mutated_primals
        self.saved_primals = part.saved_primals
        self.diff = joint.diff_outputs
        diff = set(self.diff)
        self.non_diff = [i for i in range(self.n_out) if i not in diff]
        self.num_primals = joint.num_primals
        # (primal, position among the backward's outputs, forward outputs it reaches)
        self.routes: list[tuple[int, int, frozenset[int]]] = []
        present = [p for p, has in zip(joint.grad_primals, part.grad_outputs, strict=True) if has]
        deps = [d for d, has in zip(joint.output_deps, part.grad_outputs, strict=True) if has]
        for k, (p, d) in enumerate(zip(present, deps, strict=True)):
            self.routes.append((p, k, d))
        #: positions (among the backward's outputs) of the grads kept when every
        #: differentiable output got a grad: those reaching one of them
        self.routes_all_got = [(p + 1, k) for p, k, d in self.routes if d & diff]
        #: (shape, dtype, device) of each differentiable output, for its zero grad; None:
        #: symbolic sizes, read from the outputs at each call
        self.zeros_meta = None if joint.symbolic else _static_out_meta(joint)
        #: outputs that may need a clone or a detach (``fix_outputs``); None until the first
        #: call has looked at every output
        self.to_fix: list[int] | None = None
        #: positions of the non-tensor values among (saved values, saved primals): SymInts
        self.non_tensor_saved: list[int] | None = None

    def run_forward(self, primals: Sequence) -> tuple[list, list]:
        """Run the forward graph and the mutation epilogue; (forward outputs, saved values)."""
        flat = self.forward(*primals)
        n_out, n_flat = self.n_out, self.n_flat
        if self.mutated:
            with torch.no_grad():
                for i, value in zip(self.mutated, flat[n_out:n_flat], strict=True):
                    primals[i].copy_(value)
        return list(flat[:n_out]), list(flat[n_flat:])

    def fix_outputs(self, outs: list, primals: Sequence) -> None:
        """Make the outputs fit to leave an autograd node, in ``outs``:

        - an output that is a primal or a view of one is cloned: it must be a fresh tensor of
          this node;
        - a view of a buffer of the forward (``y.view(...)``) is detached: a view made inside
          a custom Function cannot be modified in place (``out.mul_(2)`` works in eager); the
          same memory as a non-view, sharing the version counter, so an in-place write to a
          saved value is still caught at backward.

        Which outputs can need either is fixed by the generated code: the first call looks
        at every output, later calls only at those that were views, shared memory with a
        primal or had no memory to compare (a size-0 tensor)."""
        if self.to_fix is None:
            self.to_fix = [i for i, o in enumerate(outs) if isinstance(o, torch.Tensor)
                           and (o._is_view() or _may_alias(o, primals))]
        for i in self.to_fix:
            o = outs[i]
            if _is_input(o, primals):
                outs[i] = o.clone()
            elif o._is_view():
                outs[i] = o.detach()


def _static_out_meta(joint: JointGraph) -> dict[int, tuple] | None:
    """(shape, dtype, device) of each differentiable forward output, from the traced values."""
    (out_args,) = [n.args[0] for n in joint.gm.graph.nodes if n.op == "output"]
    meta = {}
    for i in joint.diff_outputs:
        node = out_args[i]
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor):
            return None
        meta[i] = (tuple(val.shape), val.dtype, val.device)
    return meta


def _may_alias(t, primals) -> bool:
    """Can output ``t`` share memory with a primal at a later call: it does now, or it has no
    memory to tell (a size-0 tensor)?"""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
        return False
    return t.untyped_storage().data_ptr() == 0 or _is_input(t, primals)


class CompiledFunction(torch.autograd.Function):
    """Forward and backward of one compiled joint graph, as one autograd node."""

    @staticmethod
    def forward(ctx, plan: _Plan, *primals):
        # (a custom Function's forward runs with grad mode off)
        outs, saved = plan.run_forward(primals)
        saved += map(primals.__getitem__, plan.saved_primals)
        if plan.non_tensor_saved is None:
            plan.non_tensor_saved = [i for i, t in enumerate(saved)
                                     if not isinstance(t, torch.Tensor)]
        if plan.non_tensor_saved:
            ctx.save_for_backward(*[t for t in saved if isinstance(t, torch.Tensor)])
            ctx.saved_non_tensors = [(i, saved[i]) for i in plan.non_tensor_saved]
        else:
            ctx.save_for_backward(*saved)
        ctx.plan = plan
        ctx.set_materialize_grads(False)
        plan.fix_outputs(outs, primals)
        if plan.zeros_meta is None:
            ctx.out_meta = {i: (outs[i].shape, outs[i].dtype, outs[i].device) for i in plan.diff}
        if plan.non_diff:
            ctx.mark_non_differentiable(*[outs[i] for i in plan.non_diff])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        if torch.is_grad_enabled():
            raise DoubleBackwardError(
                "kiln: a double backward (create_graph=True, or torch.autograd.grad of a "
                "grad) through a compiled training graph is not supported; compile with "
                "backend='eager' or run this part eagerly"
            )
        plan: _Plan = ctx.plan
        tensors = ctx.saved_tensors
        if plan.non_tensor_saved:
            tensors = list(tensors)
            for i, t in ctx.saved_non_tensors:
                tensors.insert(i, t)
        tangents, missing = [], False
        for i in plan.diff:
            g = grad_outputs[i]
            if g is None:
                missing = True
                meta = plan.zeros_meta if plan.zeros_meta is not None else ctx.out_meta
                shape, dtype, device = meta[i]
                g = torch.zeros(shape, dtype=dtype, device=device)
            else:
                g = g.contiguous()
            tangents.append(g)
        grads = plan.backward(*tensors, *tangents)
        result: list = [None] * (plan.num_primals + 1)  # [0]: the _Plan argument
        if not missing:
            for at, k in plan.routes_all_got:
                result[at] = grads[k]
            return tuple(result)
        got = {i for i in plan.diff if grad_outputs[i] is not None}
        for p, k, deps in plan.routes:
            # a grad reaching only outputs that got no grad stays None, as in eager
            if deps & got:
                result[p + 1] = grads[k]
        return tuple(result)


#: ``torch.autograd.Function``'s C ``apply`` for CompiledFunction: what ``Function.apply`` calls
#: once it has checked for functorch transforms and unwrapped dead functorch wrappers
_c_apply = super(torch.autograd.Function, CompiledFunction).apply
_functorch_active = torch._C._are_functorch_transforms_active
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead


def _apply(plan: _Plan, primals: list, tensors_only: bool):
    """``CompiledFunction.apply(plan, *primals)`` without its Python layer when every primal
    is a tensor and no functorch transform is active: the same steps (dead wrappers
    unwrapped, then the C apply) as C-level calls, instead of a Python frame, a setup-context
    check and a generator over the arguments."""
    if not tensors_only or _functorch_active():
        return CompiledFunction.apply(plan, *primals)
    return _c_apply(plan, *map(_unwrap_if_dead, primals))


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
