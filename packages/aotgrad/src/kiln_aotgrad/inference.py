"""trace_inference: a torch-level FX graph -> a functional ATen-level FX graph (no autograd).

The steps, in order (each one a few lines below):

1. pick the fake mode: the one of the example inputs when they are FakeTensors (their SymInts
   then stay symbolic: ``s0, s1, ...``), else a fresh static one;
2. make every tensor fake: inputs, and the module's parameters, buffers and tensor attributes
   ("lifted": they enter the trace as extra leading inputs, so that functionalization sees a
   mutation of a buffer as it sees one of an input);
3. trace ``functionalize(functional_call(gm, lifted, inputs))`` with ``make_fx`` under the
   decomposition table (``core_decompositions()``), inside ``torch.no_grad()``;
4. tidy up: lifted inputs become ``get_attr`` nodes again (the graph keeps the caller's
   signature), placeholders get the torch-level graph's names, every node gets ``meta["val"]``,
   dead code goes, and the output is one flat tuple of tensors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_symbols
from torch.multiprocessing.reductions import StorageWeakRef

from .core_ops import CORE_OPS
from .decompositions import core_decompositions, function_rules
from .effects import eliminate_dead_code

log = logging.getLogger("kiln.aotgrad")

__all__ = [
    "trace_inference",
    "InferenceInfo",
    "AliasedInputMutationError",
    "restore_outputs",
    "non_core_ops",
]


class AliasedInputMutationError(NotImplementedError):
    """Two inputs share memory and the program mutates one of them.

    Functionalization treats inputs as independent, so the write-back would be wrong; callers
    (the kiln backend) run such graphs eagerly instead.
    """


@dataclasses.dataclass
class InferenceInfo:
    """What the ATen graph needs to stand in for the torch-level one (``aten_gm.meta["kiln"]``).

    - ``out_spec``/``out_template``: the torch-level output's pytree structure; the template
      holds the non-tensor leaves (None, ints, ...) and ``None`` where a graph output goes.
    - ``mutated_inputs``: positions of inputs written back with ``copy_`` at the end.
    - ``mutated_attrs``: qualified names of parameters/buffers written back with ``copy_``.
    - ``num_inputs``: number of placeholders (= len(example_inputs)).
    - ``symbolic``: True when some placeholder has symbolic sizes.
    - ``trace_constants``: the get_attr targets the trace itself created (``torch.tensor(...)``
      or ``torch.empty(0)`` in the program). Their values come from the program's own data:
      module tensors are fake during the trace, so no weight value can reach them.
    """

    out_spec: Any
    out_template: list
    mutated_inputs: list[int]
    mutated_attrs: list[str]
    num_inputs: int
    symbolic: bool
    trace_constants: tuple[str, ...] = ()


def restore_outputs(aten_gm: torch.fx.GraphModule, flat_outputs: Sequence) -> Any:
    """Rebuild the torch-level graph's output (tuple, single tensor, nested, with constants)
    from the flat list of tensors the ATen graph (or code compiled from it) returns."""
    info: InferenceInfo = aten_gm.meta["kiln"]
    it = iter(flat_outputs)
    leaves = [next(it) if leaf is _GRAPH_OUTPUT else leaf for leaf in info.out_template]
    return pytree.tree_unflatten(leaves, info.out_spec)


def non_core_ops(gm: torch.fx.GraphModule) -> set:
    """The OpOverload targets in ``gm`` that are not in CORE_OPS (empty for a clean trace)."""
    return {
        n.target
        for n in gm.graph.nodes
        if n.op == "call_function"
        and isinstance(n.target, torch._ops.OpOverload)
        and n.target not in CORE_OPS
    }


class _GraphOutput:
    def __repr__(self) -> str:
        return "<graph output>"


_GRAPH_OUTPUT = _GraphOutput()


def user_saved_tensors_hooks_off(trace):
    """Run ``trace`` with the caller's saved-tensor hooks set aside: a trace inside
    ``torch.utils.checkpoint`` (non-reentrant) or ``save_on_cpu()`` would hand the fake
    tensors it saves to the user's pack hook (checkpoint counts them, and its unpack hook
    re-runs the user's eager code on real tensors inside the trace)."""

    @functools.wraps(trace)
    def traced(*args, **kwargs):
        prior = torch._C._autograd._saved_tensors_hooks_set_tracing(True)
        try:
            return trace(*args, **kwargs)
        finally:
            torch._C._autograd._saved_tensors_hooks_set_tracing(prior)

    return traced


@user_saved_tensors_hooks_off
def trace_inference(
    gm: torch.fx.GraphModule | torch.nn.Module,
    example_inputs: Sequence,
    *,
    decompositions: dict | None = None,
) -> torch.fx.GraphModule:
    """Trace ``gm`` (a torch-level graph, or any nn.Module) to a functional ATen graph.

    ``example_inputs``: real tensors (static sizes), or FakeTensors of one fake mode whose
    sizes may be SymInts (then the ATen graph is symbolic over the same ``s0, s1, ...``), plus
    any ints/SymInts/other constants the graph takes. The returned GraphModule takes the same
    inputs and returns a flat tuple of tensors (``restore_outputs`` gives back gm's structure).
    """
    example_inputs, table, fake_mode, symbolic, lifted_names, lifted_real = _trace_start(
        gm, example_inputs, decompositions)
    # 2. everything fake; module tensors lifted to leading inputs
    with _no_dispatch_modes():
        fake_inputs = [_to_fake(fake_mode, x) for x in example_inputs]
        fake_lifted = [_to_fake(fake_mode, t) for t in lifted_real]
    n_lifted = len(lifted_names)

    out_box: dict[str, Any] = {}

    def run(*args):
        params = dict(zip(lifted_names, args[:n_lifted], strict=True))
        user_args = args[n_lifted:]
        with function_rules():  # torch functions whose C++ composite would specialize sizes
            if params and isinstance(gm, torch.nn.Module):
                out = torch.func.functional_call(gm, params, tuple(user_args))
            else:
                out = gm(*user_args)
        leaves, spec = pytree.tree_flatten(out)
        out_box["spec"] = spec
        template, graph_outs = [], []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor | torch.SymInt | torch.SymFloat | torch.SymBool):
                template.append(_GRAPH_OUTPUT)
                graph_outs.append(leaf)
            else:
                template.append(leaf)
        out_box["template"] = template
        return tuple(graph_outs)

    # 3. trace
    functional = torch.func.functionalize(run, remove="mutations")
    dispatcher = _python_dispatcher() if symbolic else contextlib.nullcontext()
    with torch.no_grad(), fake_mode, dispatcher:
        traced = make_fx(functional, decomposition_table=table, tracing_mode="real")(
            *fake_lifted, *fake_inputs
        )

    # 4. tidy up
    aten_gm = _finish(
        traced, gm, fake_mode, lifted_names, lifted_real, fake_lifted, fake_inputs, example_inputs
    )
    lifted = set(lifted_names)
    info = InferenceInfo(
        out_spec=out_box["spec"],
        out_template=out_box["template"],
        mutated_inputs=[],
        mutated_attrs=[],
        num_inputs=len(example_inputs),
        symbolic=symbolic,
        trace_constants=tuple(n.target for n in aten_gm.graph.nodes
                              if n.op == "get_attr" and n.target not in lifted),
    )
    _record_mutations(aten_gm, info, example_inputs)
    aten_gm.meta["kiln"] = info
    leftovers = non_core_ops(aten_gm)
    if leftovers:
        log.debug("ops outside CORE_OPS left in the graph: %s", sorted(map(str, leftovers)))
    return aten_gm


# ----------------------------------------------------------------------------------------
# step 1: the fake mode


def _is_symbolic(x) -> bool:
    if isinstance(x, torch.Tensor):
        return bool(free_symbols(x))
    if isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
        return bool(free_symbols(x))
    return False


def _trace_start(gm, example_inputs: Sequence, decompositions: dict | None):
    """What an inference and a joint trace both start from: the example values (symbolic
    where gm's graph is), the decomposition table, the fake mode, whether any size is
    symbolic, and gm's module tensors (names, real tensors) to lift to leading inputs."""
    example_inputs = _symbolic_example_values(gm, list(example_inputs))
    table = core_decompositions() if decompositions is None else decompositions
    fake_mode = _fake_mode_for(gm, example_inputs)
    symbolic = any(_is_symbolic(x) for x in example_inputs)
    return (example_inputs, table, fake_mode, symbolic, *_module_tensors(gm))


def _symbolic_example_values(gm, example_inputs: list) -> list:
    """torch.compile-style callers pass real tensors but mark dynamic sizes on the placeholders'
    ``meta["example_value"]``: trace over those symbolic fakes then (else sizes that the caller
    treats as dynamic would be baked in)."""
    if not isinstance(gm, torch.fx.GraphModule):
        return example_inputs
    if any(isinstance(x, FakeTensor) for x in example_inputs):
        return example_inputs
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(phs) != len(example_inputs):
        return example_inputs
    values = [ph.meta.get("example_value", ph.meta.get("val")) for ph in phs]
    if not any(_is_symbolic(v) for v in values):
        return example_inputs
    modes = {id(v.fake_mode) for v in values if isinstance(v, FakeTensor)}
    if len(modes) > 1:
        return example_inputs
    picked = []
    for x, v in zip(example_inputs, values, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(v, FakeTensor):
            picked.append(v)
        elif isinstance(x, int) and isinstance(v, torch.SymInt):
            picked.append(v)
        else:
            picked.append(x)
    return picked


def _fake_mode_for(gm, example_inputs) -> FakeTensorMode:
    modes = {id(x.fake_mode): x.fake_mode for x in example_inputs if isinstance(x, FakeTensor)}
    if len(modes) > 1:
        raise ValueError("example inputs come from more than one FakeTensorMode")
    if modes:
        return next(iter(modes.values()))
    for x in example_inputs:  # only SymInts: reuse their ShapeEnv
        if isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
            return FakeTensorMode(shape_env=x.node.shape_env, allow_non_fake_inputs=False)
    return FakeTensorMode(allow_fallback_kernels=True, shape_env=ShapeEnv(), static_shapes=True)


@contextlib.contextmanager
def _no_dispatch_modes():
    # make real->fake conversion immune to modes the caller may have active
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        yield


def _to_fake(fake_mode: FakeTensorMode, x):
    if isinstance(x, FakeTensor):
        if x.fake_mode is not fake_mode:
            raise ValueError("a FakeTensor input belongs to another FakeTensorMode")
        return x
    if isinstance(x, torch.Tensor):
        # real tensors (inputs of a static trace, parameters, buffers) keep static sizes
        return fake_mode.from_tensor(x, static_shapes=True)
    return x


def _python_dispatcher():
    from torch._dispatch.python import enable_python_dispatcher

    return enable_python_dispatcher()


# ----------------------------------------------------------------------------------------
# step 2: the tensors a module holds


def _module_tensors(gm) -> tuple[list[str], list[torch.Tensor]]:
    """Parameters, buffers, and plain tensor attributes read by get_attr nodes (deduplicated
    by identity, first name wins: tied weights stay tied)."""
    if not isinstance(gm, torch.nn.Module):
        return [], []
    names: list[str] = []
    tensors: list[torch.Tensor] = []
    seen: set[int] = set()

    def add(name: str, t) -> None:
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            names.append(name)
            tensors.append(t)

    for name, p in gm.named_parameters():
        add(name, p)
    for name, b in gm.named_buffers():
        add(name, b)
    if isinstance(gm, torch.fx.GraphModule):
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                add(node.target, _fetch_attr(gm, node.target))
    return names, tensors


def _assign_attr(mod: torch.nn.Module, target: str, value) -> None:
    *path, field = target.split(".")
    for atom in path:
        sub = getattr(mod, atom, None)
        if not isinstance(sub, torch.nn.Module):
            sub = torch.nn.Module()
            setattr(mod, atom, sub)
        mod = sub
    if hasattr(mod, field) and field not in mod._parameters and field not in mod._buffers:
        delattr(mod, field)
    if isinstance(value, torch.nn.Parameter):
        mod.register_parameter(field, value)
    else:  # buffers and plain tensor attributes: buffers of the ATen graph
        mod.register_buffer(field, value)


def _fetch_attr(mod: torch.nn.Module, target: str):
    obj = mod
    for atom in target.split("."):
        obj = getattr(obj, atom)
    return obj


# ----------------------------------------------------------------------------------------
# step 4: tidy up


def _finish(
    traced, gm, fake_mode, lifted_names, lifted_real, fake_lifted, fake_inputs, example_inputs
):
    graph = traced.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    n_lifted = len(lifted_names)
    assert len(placeholders) == n_lifted + len(example_inputs), "placeholder count mismatch"

    attrs: dict[str, Any] = {}

    # lifted module tensors -> get_attr nodes under their qualified names
    first_real = next((n for n in graph.nodes if n.op != "placeholder"), None)
    for ph, name, real, fake in zip(
        placeholders[:n_lifted], lifted_names, lifted_real, fake_lifted, strict=True
    ):
        _assign_attr(traced, name, real)
        with graph.inserting_before(first_real):
            node = graph.get_attr(name)
        node.meta.update(ph.meta)
        node.meta["val"] = fake
        ph.replace_all_uses_with(node)
        graph.erase_node(ph)
        attrs[name] = real

    # tensor constants make_fx created (e.g. torch.tensor(...) inside the program)
    for node in graph.nodes:
        if node.op == "get_attr" and node.target not in attrs:
            value = _fetch_attr(traced, node.target)
            attrs[node.target] = value
            if "val" not in node.meta and isinstance(value, torch.Tensor):
                with _no_dispatch_modes():
                    node.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)

    # placeholder names and values of the caller's graph
    user_phs = placeholders[n_lifted:]
    src_names = _placeholder_names(gm, len(user_phs))
    for ph, fake, name in zip(user_phs, fake_inputs, src_names, strict=True):
        ph.meta.setdefault("val", fake)
        if not isinstance(ph.meta["val"], torch.Tensor | torch.SymInt | torch.SymFloat):
            ph.meta["val"] = fake
        if name and ph.name != name:
            ph._rename(name)
            ph.target = ph.name

    eliminate_dead_code(graph)

    # the output: one flat tuple, with meta["val"]
    out = graph.output_node()
    (result,) = out.args
    if not isinstance(result, tuple | list):
        result = (result,)
    out.args = (tuple(result),)
    out.meta["val"] = tuple(
        a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in result
    )

    for node in graph.nodes:
        if node.op == "call_function" and "val" not in node.meta:
            node.meta["val"] = _val_of(node)

    graph.lint()
    aten_gm = torch.fx.GraphModule(traced, graph, class_name="AtenGraph")
    aten_gm.meta = {}
    return aten_gm


def _val_of(node: torch.fx.Node):
    # getitem on a multi-output op: the item of the parent's value
    import operator

    if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
        parent = node.args[0].meta.get("val")
        if isinstance(parent, list | tuple):
            return parent[node.args[1]]
    return None


def _placeholder_names(gm, n: int) -> list[str | None]:
    if isinstance(gm, torch.fx.GraphModule):
        names = [p.name for p in gm.graph.nodes if p.op == "placeholder"]
        if len(names) == n:
            return names
    return [None] * n


def _record_mutations(aten_gm, info: InferenceInfo, example_inputs) -> None:
    graph = aten_gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    position = {ph: i for i, ph in enumerate(placeholders)}
    for node in graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default:
            dst = node.args[0]
            if dst in position:
                info.mutated_inputs.append(position[dst])
            elif dst.op == "get_attr":
                info.mutated_attrs.append(dst.target)
    if not info.mutated_inputs:
        return
    # a mutated input that shares memory with another input: the write-back would be wrong
    storages = {}
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor):
            storages.setdefault(StorageWeakRef(x.untyped_storage()), []).append(i)
    for group in storages.values():
        if len(group) > 1 and any(i in info.mutated_inputs for i in group):
            raise AliasedInputMutationError(
                f"inputs {group} share memory and input(s) "
                f"{[i for i in group if i in info.mutated_inputs]} are mutated; "
                "aotgrad does not trace mutations of aliased inputs"
            )
