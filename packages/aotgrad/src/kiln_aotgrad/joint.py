"""trace_joint: a torch-level FX graph -> one functional ATen graph computing forward and backward.

The joint graph takes ``(*primals, *tangents)`` and returns
``(*forward_outputs, *mutated_values, *grads)``:

- primals: the module's parameters and buffers (lifted, as in ``trace_inference``), then the
  graph's own inputs;
- tangents: one per forward output that requires grad (the incoming ``grad_output``);
- forward outputs: the torch-level graph's tensor outputs, flat;
- mutated values: the new value of each primal the program mutated (BatchNorm's running
  stats); the runtime copies them into the primals once per call (the epilogue);
- grads: one per primal that requires grad, ``None`` where the primal does not reach any
  output (so its ``.grad`` stays None, as in eager).

How, in two traces (both with ``make_fx`` under the fake mode of ``trace_inference``):

1. trace ``joint`` with autograd on: it runs the graph (under the function rules), then
   ``torch.autograd.grad(outputs, diff_primals, tangents, allow_unused=True)``; autograd's
   backward formulas dispatch ATen ops that the trace records, decomposed by the same table.
   ``no_grad`` regions inside the graph run as such, so they contribute no backward.
2. trace ``torch.func.functionalize(step_1_graph, remove="mutations")``: in-place ops become
   functional ones, and each mutated primal gets one ``copy_`` at the end, which step 3 turns
   into a "mutated value" output. (``functionalize`` does not compose with ``autograd.grad``
   inside one trace, hence two.)

Random ops (dropout's ``bernoulli``) are traced once, in the forward part; the backward reads
the mask they produced, so the partitioner must save it (it never recomputes random ops).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

from . import checkpoint
from .decompositions import function_rules
from .effects import eliminate_dead_code
from .inference import (
    _GRAPH_OUTPUT,
    _no_dispatch_modes,
    _placeholder_names,
    _python_dispatcher,
    _to_fake,
    _trace_start,
    _val_of,
    user_saved_tensors_hooks_off,
)

__all__ = ["trace_joint", "JointGraph", "MutatedGradInputError"]


class MutatedGradInputError(NotImplementedError):
    """The program mutates a tensor that requires grad; the joint graph cannot express that
    (callers run such graphs eagerly)."""


@dataclasses.dataclass
class JointGraph:
    """A joint forward+backward ATen graph and what the runtime needs to call its pieces.

    - ``gm``: placeholders ``primals`` then ``tangents``; output
      ``(*forward_outputs, *mutated_values, *grads)`` (grads may be None);
    - ``lifted_names``/``lifted_tensors``: the module tensors that lead the primals (the same
      objects as the module's: an optimizer step is seen by the next call);
    - ``num_user_inputs``: primals after the lifted ones (the graph's own inputs);
    - ``requires_grad``: per primal, whether it required grad when traced;
    - ``grad_primals``: positions of the primals that get a grad output, in order;
    - ``diff_outputs``: positions (among forward outputs) that have a tangent;
    - ``mutated_primals``: positions of primals whose new value follows the forward outputs;
    - ``out_spec``/``out_template``: the torch-level output structure (``restore_outputs``);
    - ``output_deps``: per grad primal, the forward outputs it reaches (a param whose outputs
      all get no grad keeps ``.grad`` None);
    - ``leaf_inputs``: positions of the graph's own inputs (among the primals) that were leaf
      tensors requiring grad when traced: autograd's graph holds those until the backward, as
      the module holds its lifted tensors, so the partitioner saves them for free.
    """

    gm: torch.fx.GraphModule
    lifted_names: list[str]
    lifted_tensors: list[torch.Tensor]
    num_user_inputs: int
    requires_grad: list[bool]
    grad_primals: list[int]
    num_forward_outputs: int
    diff_outputs: list[int]
    mutated_primals: list[int]
    out_spec: Any
    out_template: list
    output_deps: list[frozenset[int]]
    symbolic: bool
    leaf_inputs: list[int] = dataclasses.field(default_factory=list)

    @property
    def num_primals(self) -> int:
        return len(self.lifted_names) + self.num_user_inputs

    @property
    def num_tangents(self) -> int:
        return len(self.diff_outputs)

    def __str__(self) -> str:
        return (
            f"JointGraph(primals={self.num_primals} ({len(self.lifted_names)} lifted), "
            f"tangents={self.num_tangents}, forward_outputs={self.num_forward_outputs}, "
            f"mutated={self.mutated_primals}, grads for primals {self.grad_primals})"
        )


@user_saved_tensors_hooks_off
def trace_joint(
    gm: torch.fx.GraphModule | torch.nn.Module,
    example_inputs: Sequence,
    *,
    decompositions: dict | None = None,
) -> JointGraph:
    """Trace ``gm`` forward and backward into one functional ATen graph (module docstring).

    ``example_inputs`` as for ``trace_inference`` (real tensors, or FakeTensors with SymInt
    sizes: the joint graph is then symbolic over the same symbols)."""
    leaf_inputs = [i for i, x in enumerate(example_inputs)
                   if isinstance(x, torch.Tensor) and x.requires_grad and x.is_leaf]
    example_inputs, table, fake_mode, symbolic, lifted_names, lifted_real = _trace_start(
        gm, example_inputs, decompositions)
    with _no_dispatch_modes():
        fake_primals = [_to_fake(fake_mode, t) for t in lifted_real]
        fake_primals += [_to_fake(fake_mode, x) for x in example_inputs]
    n_lifted = len(lifted_names)
    requires_grad = [isinstance(p, torch.Tensor) and p.requires_grad for p in fake_primals]
    grad_primals = [i for i, rg in enumerate(requires_grad) if rg]

    # checkpoint regions: interpreted node by node so their tags reach the ATen nodes
    regions = checkpoint.tagged(gm)
    module = checkpoint.InterpretedModule(gm) if regions else gm
    prefix = "inner." if regions else ""

    def call(primals):
        params = {prefix + k: v for k, v in zip(lifted_names, primals[:n_lifted], strict=True)}
        user_args = tuple(primals[n_lifted:])
        with torch.enable_grad(), function_rules(), checkpoint.interpreted(regions):
            if params and isinstance(gm, torch.nn.Module):
                return torch.func.functional_call(module, params, user_args)
            return module(*user_args)

    # 0. a probe run on fake tensors: the output structure, and which outputs need a tangent
    dispatcher = _python_dispatcher if symbolic else contextlib.nullcontext
    with fake_mode, dispatcher():
        probe_primals = [_fresh_fake(p) for p in fake_primals]
        try:
            leaves, out_spec = pytree.tree_flatten(call(probe_primals))
        except RuntimeError as e:  # inputs are leaves in the trace: in-place on one fails
            if "leaf Variable that requires grad" in str(e):
                raise MutatedGradInputError(
                    "the program mutates an input that requires grad in place; the training "
                    "path does not trace such mutations"
                ) from e
            raise
        template, outs = _split_outputs(leaves)
        diff_outputs = [
            i for i, o in enumerate(outs) if isinstance(o, torch.Tensor) and o.requires_grad
        ]
        fake_tangents = [_tangent_like(outs[i]) for i in diff_outputs]

    n_primals = len(fake_primals)

    def joint(*args):
        primals, tangents = list(args[:n_primals]), args[n_primals:]
        leaves, _ = pytree.tree_flatten(call(primals))
        _, outs = _split_outputs(leaves)
        diff = [outs[i] for i in diff_outputs]
        wrt = [primals[i] for i in grad_primals]
        grads: Sequence = ()
        if diff and wrt:
            grads = torch.autograd.grad(diff, wrt, list(tangents), allow_unused=True)
        else:
            grads = [None] * len(wrt)
        return (*outs, *grads)

    # 1. joint trace with autograd; 2. functionalize it
    with fake_mode, dispatcher():
        step1 = make_fx(joint, decomposition_table=table, tracing_mode="real")(
            *fake_primals, *fake_tangents
        )
        functional = torch.func.functionalize(
            functools.partial(checkpoint.run_interpreted, step1) if regions else step1,
            remove="mutations")
        with torch.no_grad(), _real_constants_allowed(fake_mode), \
                checkpoint.interpreted(regions):
            step2 = make_fx(functional, decomposition_table=table, tracing_mode="real")(
                *fake_primals, *fake_tangents
            )

    # 3. tidy up: names, mutations -> outputs, meta["val"]
    num_fw = len(outs)
    user_names = _placeholder_names(gm, len(example_inputs))
    mutated = _finish_joint(
        step2,
        fake_primals + fake_tangents,
        names=[_primal_name(n) for n in lifted_names]
        + [n or f"input_{i}" for i, n in enumerate(user_names)]
        + [f"tangent_{i}" for i in range(len(fake_tangents))],
        num_fw=num_fw,
    )
    for i in mutated:
        if requires_grad[i]:
            raise MutatedGradInputError(
                f"the program mutates primal {i} in place, which requires grad; "
                "the training path does not trace such mutations"
            )
    joint_gm = torch.fx.GraphModule(step2, step2.graph, class_name="JointGraph")
    output_deps = _output_dependencies(joint_gm, grad_primals, num_fw)
    return JointGraph(
        gm=joint_gm, lifted_names=lifted_names, lifted_tensors=lifted_real,
        num_user_inputs=len(example_inputs), requires_grad=requires_grad,
        grad_primals=grad_primals, num_forward_outputs=num_fw, diff_outputs=diff_outputs,
        mutated_primals=mutated, out_spec=out_spec, out_template=template,
        output_deps=output_deps, symbolic=symbolic,
        leaf_inputs=[n_lifted + i for i in leaf_inputs])


# ----------------------------------------------------------------------------------------
# helpers


@contextlib.contextmanager
def _real_constants_allowed(fake_mode):
    """The second trace runs the first one's graph, whose tensor constants (``torch.tensor(8.)``
    built in the traced code: ``_tensor_constant`` attributes) are real tensors: the fake mode
    takes them as constants there, as the first trace did, instead of failing on them."""
    saved = fake_mode.allow_non_fake_inputs
    fake_mode.allow_non_fake_inputs = True
    try:
        yield
    finally:
        fake_mode.allow_non_fake_inputs = saved


def _split_outputs(leaves: list) -> tuple[list, list]:
    template, outs = [], []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            template.append(_GRAPH_OUTPUT)
            outs.append(leaf)
        else:
            template.append(leaf)
    return template, outs


def _fresh_fake(p):
    # a probe copy: the probe's in-place ops (running stats) must not touch the traced fakes
    if not isinstance(p, torch.Tensor):
        return p
    q = torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device=p.device)
    return q.requires_grad_(p.requires_grad)


def _tangent_like(out: torch.Tensor) -> torch.Tensor:
    """A contiguous tangent with the output's (possibly symbolic) shape: the runtime makes
    incoming grads contiguous, so the backward is compiled for contiguous tangents."""
    return torch.empty(out.shape, dtype=out.dtype, device=out.device)


def _primal_name(qualname: str) -> str:
    return "primal_" + qualname.replace(".", "_")


def _finish_joint(traced, fakes: list, *, names: list[str], num_fw: int) -> list[int]:
    """Rename placeholders, turn the trailing ``copy_(primal, new)`` write-backs into extra
    outputs placed after the forward outputs; returns the mutated primals' positions."""
    graph = traced.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == len(fakes) == len(names), "placeholder count mismatch"
    for ph, fake, name in zip(placeholders, fakes, names, strict=True):
        ph.meta["val"] = fake
        if ph.name != name:
            ph._rename(name)
            ph.target = ph.name
    position = {ph: i for i, ph in enumerate(placeholders)}

    mutated: list[int] = []
    new_values: list[torch.fx.Node] = []
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default:
            dst, src = node.args[0], node.args[1]
            if dst not in position:
                raise NotImplementedError(f"a write-back into a non-input: {node.format_node()}")
            mutated.append(position[dst])
            new_values.append(src)
            graph.erase_node(node)

    out = graph.output_node()
    (result,) = out.args
    result = list(result) if isinstance(result, tuple | list) else [result]
    result = [*result[:num_fw], *new_values, *result[num_fw:]]
    out.args = (tuple(result),)
    eliminate_dead_code(graph)
    for node in graph.nodes:
        if node.op == "call_function" and "val" not in node.meta:
            node.meta["val"] = _val_of(node)
    out.meta["val"] = tuple(
        a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in result
    )
    graph.lint()
    return mutated


def _output_dependencies(
    joint_gm: torch.fx.GraphModule, grad_primals: list[int], num_fw: int
) -> list[frozenset[int]]:
    """For each grad primal, the forward outputs whose value depends on it."""
    graph = joint_gm.graph
    placeholders = {n: i for i, n in enumerate(n for n in graph.nodes if n.op == "placeholder")}
    outputs = list(graph.output_node().args[0])[:num_fw]
    reaches: dict[torch.fx.Node, set[int]] = {}
    for node in graph.nodes:  # forward closure: which primals each node depends on
        if node.op == "placeholder":
            reaches[node] = {placeholders[node]}
        elif node.op != "output":
            deps: set[int] = set()
            for a in node.all_input_nodes:
                deps |= reaches.get(a, set())
            reaches[node] = deps
    result = []
    for p in grad_primals:
        result.append(
            frozenset(
                i
                for i, o in enumerate(outputs)
                if isinstance(o, torch.fx.Node) and p in reaches.get(o, ())
            )
        )
    return result
