"""Traceable tensor subclasses at the graph boundary: ``desugar_subclasses``.

A traceable subclass (``__tensor_flatten__``/``__tensor_unflatten__`` with
``__torch_dispatch__``: TwoTensor, DTensor, quantized weights) is taken apart where the graph
starts and put back together where it ends, so that every graph after this one holds plain
tensors only:

1. each subclass input, and each subclass parameter or buffer of the module, is flattened
   (recursively) into its inner tensors: these are the new graph's inputs (a subclass
   parameter is read from the module at every call, so an optimizer step is seen);
2. ``make_fx`` traces a function of the inner tensors that rebuilds the subclasses
   (``__tensor_unflatten__`` on fake inner tensors), runs the graph and flattens its outputs:
   each op on a subclass runs its ``__torch_dispatch__``, whose ops on the inner tensors are
   what the trace records (plain ATen, plus functional collectives for DTensor);
3. ``Desugared.wrap(compiled)`` is the runtime boundary: it flattens the call's subclass
   arguments, calls the compiled plain graph and rebuilds the outputs with
   ``__tensor_unflatten__`` and the metadata the trace saw. Under autograd both directions
   are autograd Functions, so a grad reaching an inner tensor is wrapped back into the
   subclass (``.grad`` of a subclass parameter is that subclass).

Autograd then differentiates the subclass's dispatch logic on the inner tensors: equal to
eager for subclasses whose ops act on their inner tensors (TwoTensor, DTensor), not for one
whose eager backward differs from the derivative of its dispatch code (docs/tensor-subclasses.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .inference import (
    _assign_attr,
    _fake_mode_for,
    _fetch_attr,
    _module_tensors,
    _no_dispatch_modes,
    _to_fake,
)

__all__ = ["Layout", "Opaque", "Desugared", "desugar_subclasses", "has_subclasses", "layout_of",
           "flatten", "unflatten"]


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one subclass value splits into plain tensors: its class, inner attribute names,
    flatten context and outer size/stride; ``inner`` per attribute (None: a plain tensor)."""

    cls: type
    attrs: tuple[str, ...]
    ctx: Any
    outer_size: tuple
    outer_stride: tuple
    inner: tuple[Layout | Opaque | None, ...]

    @property
    def num_tensors(self) -> int:
        return sum(1 if sub is None else sub.num_tensors for sub in self.inner)


@dataclasses.dataclass(frozen=True, eq=False)
class Opaque:
    """A flattened member that is no tensor (DTensor's ``device_mesh``): kept as it was
    traced (the frontend guards it), never a graph input."""

    value: Any
    num_tensors = 0


def layout_of(t: Any) -> Layout | Opaque | None:
    """The layout of ``t``, None for a plain tensor."""
    if not isinstance(t, torch.Tensor):
        return Opaque(t)
    if not is_traceable_wrapper_subclass(t):
        return None
    attrs, ctx = t.__tensor_flatten__()
    return Layout(type(t), tuple(attrs), ctx, tuple(t.size()), tuple(t.stride()),
                  tuple(layout_of(getattr(t, a)) for a in attrs))


def flatten(t: Any, layout: Layout | Opaque | None) -> list[torch.Tensor]:
    """The plain tensors inside ``t`` in the order ``layout`` lists them."""
    if layout is None:
        return [t]
    if isinstance(layout, Opaque):
        return []
    out: list[torch.Tensor] = []
    for attr, sub in zip(layout.attrs, layout.inner, strict=True):
        out += flatten(getattr(t, attr), sub)
    return out


def unflatten(layout: Layout | Opaque | None, it) -> Any:
    """Rebuild one value from the iterator of plain tensors ``it`` (``__tensor_unflatten__``)."""
    if layout is None:
        return next(it)
    if isinstance(layout, Opaque):
        return layout.value
    inner = {attr: unflatten(sub, it) for attr, sub in zip(layout.attrs, layout.inner,
                                                           strict=True)}
    return layout.cls.__tensor_unflatten__(inner, layout.ctx, layout.outer_size,
                                           layout.outer_stride)


def has_subclasses(gm, example_inputs: Sequence) -> bool:
    """Does an input, parameter or buffer of ``gm`` hold a traceable subclass?"""
    if any(is_traceable_wrapper_subclass(x) for x in example_inputs):
        return True
    return isinstance(gm, torch.nn.Module) and any(
        is_traceable_wrapper_subclass(t) for t in _module_tensors(gm)[1])


@dataclasses.dataclass
class Desugared:
    """The plain graph standing for a graph over subclasses, and how to call it.

    ``gm`` takes ``example_inputs``: the inner tensors of the subclass module tensors named
    ``lifted`` (in order), then each original input flattened (``input_layouts``); it returns
    a flat tuple of plain tensors, rebuilt by ``out_layouts``/``out_template``/``out_spec``."""

    gm: torch.fx.GraphModule
    example_inputs: list
    source: torch.nn.Module | None
    lifted: list[tuple[str, Layout]]
    input_layouts: list[Layout | None]
    out_layouts: list[Layout | None]
    out_template: list
    out_spec: Any
    plain_requiring_grad: list[str] = dataclasses.field(default_factory=list)
    #: the original program and the names of its plain module tensors (``training_gm``)
    program: Callable | None = None
    plain_names: tuple[str, ...] = ()

    def training_mismatch(self) -> str | None:
        """Why autograd of the plain graph would differ from eager's, or None. Eager
        differentiates at the subclass level: a plain tensor requiring grad that meets a
        subclass which flows to an output gets a grad of that subclass (TwoTensor), which
        the plain graph (one grad per plain tensor) cannot give; callers run it eagerly."""
        if not any(layout is not None for layout in self.out_layouts):
            return None
        rg = self.plain_requiring_grad
        if rg:
            return (f"plain tensor(s) {', '.join(rg)} require grad and meet a tensor subclass "
                    "that reaches an output: eager gives them a grad of the subclass")
        return None

    def flat_args(self, args: Sequence) -> list:
        flat: list = []
        for name, layout in self.lifted:
            flat += _flatten_for_call(_fetch_attr(self.source, name), layout)
        for x, layout in zip(args, self.input_layouts, strict=True):
            flat += [x] if layout is None else _flatten_for_call(x, _check(x, layout))
        return flat

    def restore(self, flat_outputs: Sequence) -> Any:
        it = iter(flat_outputs)
        values = [_unflatten_for_call(layout, it) for layout in self.out_layouts]
        vit = iter(values)
        leaves = [next(vit) if leaf is _OUT else leaf for leaf in self.out_template]
        return pytree.tree_unflatten(leaves, self.out_spec)

    def training_gm(self) -> torch.fx.GraphModule:
        """The graph to differentiate: ``gm``'s signature (the plain module tensors as
        ``get_attr``, the inner tensors as inputs), but one node that rebuilds the subclasses,
        runs the original program on them and flattens its outputs (``_SubclassProgram``).
        Tracing its joint differentiates at the subclass level, as eager does: DTensor's
        backward rules (``Redistribute.backward`` keeps a grad Replicate where the forward
        made a Partial) apply, which differentiating the flattened ATen ops would not."""
        graph = torch.fx.Graph()
        old = {n.op: [] for n in self.gm.graph.nodes}
        for n in self.gm.graph.nodes:
            old[n.op].append(n)
        inputs = []
        for ph in old["placeholder"]:
            node = graph.placeholder(ph.target)
            node.meta.update(ph.meta)
            inputs.append(node)
        plain = []
        for ga in old.get("get_attr", []):
            if ga.target in self.plain_names:
                node = graph.get_attr(ga.target)
                node.meta.update(ga.meta)
                plain.append((ga.target, node))
        names = [name for name, _ in plain]
        plain_nodes = [node for _, node in plain]
        program = _SubclassProgram(self, names)
        call = graph.call_function(program, (*plain_nodes, *inputs))
        out_vals = [o.meta.get("val") for o in old["output"][0].args[0]]
        outs = []
        for i, val in enumerate(out_vals):
            item = graph.call_function(operator.getitem, (call, i))
            if val is not None:
                item.meta["val"] = val
            outs.append(item)
        graph.output(tuple(outs))
        owner = torch.nn.Module()
        for name in names:
            _assign_attr(owner, name, _fetch_attr(self.gm, name))
        return torch.fx.GraphModule(owner, graph, class_name="SubclassProgram")

    def wrap(self, compiled: Callable) -> Callable:
        """``compiled`` (a callable of the plain graph) behind the subclass boundary."""

        def compiled_subclass_graph(*args):
            outs = compiled(*self.flat_args(args))
            if not isinstance(outs, (tuple, list)):
                outs = (outs,)
            return self.restore(outs)

        compiled_subclass_graph.desugared = self
        return compiled_subclass_graph


class _SubclassProgram:
    """The target of ``training_gm``'s one node: ``(*plain module tensors, *inner tensors)``
    -> the flat plain outputs of the original program run on rebuilt subclasses. Rebuilding
    and flattening go through ``_Unflatten``/``_Flatten`` where grads are needed, so the grad
    of an inner tensor is the inner tensor of the subclass's grad."""

    def __init__(self, desugared: Desugared, plain_names: list[str]):
        self.d = desugared
        self.plain_names = plain_names
        # the name says which program it runs: a compile cache keys call targets by name
        program = desugared.program
        text = getattr(program, "code", None) or f"{type(program).__qualname__}@{id(program)}"
        text += repr((desugared.lifted, desugared.input_layouts, desugared.out_layouts))
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        self.__name__ = self.__qualname__ = f"subclass_program_{digest}"

    def __call__(self, *args):
        d = self.d
        n = len(self.plain_names)
        params = dict(zip(self.plain_names, args[:n], strict=True))
        it = iter(args[n:])
        params.update({name: _unflatten_for_call(layout, it) for name, layout in d.lifted})
        user = [_unflatten_for_call(layout, it) for layout in d.input_layouts]
        gm = d.program
        if params and isinstance(gm, torch.nn.Module):
            out = torch.func.functional_call(gm, params, tuple(user))
        else:
            out = gm(*user)
        flat: list = []
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                layout = layout_of(leaf)
                flat += [leaf] if layout is None else _flatten_for_call(leaf, layout)
        return tuple(flat)


class _Out:
    def __repr__(self) -> str:
        return "<graph output>"


_OUT = _Out()


def _check(x, layout: Layout) -> Layout:
    if type(x) is not layout.cls:  # the frontend guards the type; a direct caller may not
        raise TypeError(f"expected a {layout.cls.__qualname__}, got {type(x).__qualname__}")
    return layout


def desugar_subclasses(gm: torch.fx.GraphModule | torch.nn.Module,
                       example_inputs: Sequence) -> Desugared:
    """Trace ``gm`` over the inner tensors of its subclass inputs and module tensors (module
    docstring); plain module tensors stay ``get_attr`` attributes of the new graph."""
    example_inputs = list(example_inputs)
    fake_mode = _fake_mode_for(gm, example_inputs)
    names, tensors = _module_tensors(gm)
    plain_attrs = [(n, t) for n, t in zip(names, tensors, strict=True)
                   if not is_traceable_wrapper_subclass(t)]
    lifted = [(n, layout_of(t)) for n, t in zip(names, tensors, strict=True)
              if is_traceable_wrapper_subclass(t)]
    input_layouts = [layout_of(x) if isinstance(x, torch.Tensor) else None
                     for x in example_inputs]

    real_flat: list = []
    for name, layout in lifted:
        real_flat += flatten(_fetch_attr(gm, name), layout)
    for x, layout in zip(example_inputs, input_layouts, strict=True):
        real_flat += [x] if layout is None else flatten(x, layout)
    with _no_dispatch_modes():
        fake_plain = [_to_fake(fake_mode, t) for _, t in plain_attrs]
        fake_flat = [_to_fake(fake_mode, x) for x in real_flat]
    n_plain = len(plain_attrs)
    box: dict[str, Any] = {}

    def flat_program(*args):
        it = iter(args[n_plain:])
        params = dict(zip([n for n, _ in plain_attrs], args[:n_plain], strict=True))
        params.update({name: unflatten(layout, it) for name, layout in lifted})
        user = [unflatten(layout, it) if layout is not None else next(it)
                for layout in input_layouts]
        if params and isinstance(gm, torch.nn.Module):
            out = torch.func.functional_call(gm, params, tuple(user))
        else:
            out = gm(*user)
        leaves, box["spec"] = pytree.tree_flatten(out)
        template, layouts, flat_out = [], [], []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                template.append(_OUT)
                layout = layout_of(leaf)
                layouts.append(layout)
                flat_out += flatten(leaf, layout)
            else:
                template.append(leaf)
        box["template"], box["layouts"] = template, layouts
        return tuple(flat_out)

    with fake_mode:
        traced = make_fx(flat_program, tracing_mode="real")(*fake_plain, *fake_flat)

    # plain module tensors: get_attr nodes again, holding the module's own tensors
    graph = traced.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first = next((n for n in graph.nodes if n.op != "placeholder"), None)
    for ph, (name, real) in zip(placeholders[:n_plain], plain_attrs, strict=True):
        _assign_attr(traced, name, real)
        with graph.inserting_before(first):
            node = graph.get_attr(name)
        node.meta.update(ph.meta)
        ph.replace_all_uses_with(node)
        graph.erase_node(ph)
    graph.lint()
    plain_gm = torch.fx.GraphModule(traced, graph, class_name="DesugaredGraph")
    return Desugared(
        gm=plain_gm,
        example_inputs=_example_flat(lifted, gm, example_inputs, input_layouts, real_flat),
        source=gm if isinstance(gm, torch.nn.Module) else None,
        lifted=lifted,
        input_layouts=input_layouts,
        out_layouts=box["layouts"],
        out_template=box["template"],
        out_spec=box["spec"],
        program=gm,
        plain_names=tuple(n for n, _ in plain_attrs),
        plain_requiring_grad=[n for n, t in plain_attrs if t.requires_grad] + [
            f"input {i}" for i, (x, layout) in enumerate(zip(example_inputs, input_layouts,
                                                              strict=True))
            if layout is None and isinstance(x, torch.Tensor) and x.requires_grad],
    )


def _example_flat(lifted, gm, example_inputs, input_layouts, real_flat) -> list:
    """The inner tensors as example inputs, requiring grad where their subclass does (inner
    tensors themselves never do: at run time ``_Flatten`` gives such aliases), so that the
    backend takes the training path exactly when the subclass graph needs it."""
    outers = [_fetch_attr(gm, name) for name, _ in lifted]
    outers += [x for x, layout in zip(example_inputs, input_layouts, strict=True)
               if layout is not None]
    needs = {id(t) for t in outers if t.requires_grad}
    wanted = set()
    for t in outers:
        if id(t) in needs:
            wanted |= {id(i) for i in flatten(t, layout_of(t))}
    return [x.detach().requires_grad_(True)
            if isinstance(x, torch.Tensor) and id(x) in wanted and x.is_floating_point()
            else x for x in real_flat]


# ----------------------------------------------------------------------------------------
# the runtime boundary


def _needs_grad(ts) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in ts)


def _flatten_for_call(x: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    if _needs_grad([x]):
        return list(_Flatten.apply(layout, x))
    return flatten(x, layout)


def _unflatten_for_call(layout: Layout | None, it) -> torch.Tensor:
    if layout is None:
        return next(it)
    inner = [next(it) for _ in range(layout.num_tensors)]
    if _needs_grad(inner):
        return _Unflatten.apply(layout, *inner)
    return unflatten(layout, iter(inner))


class _Flatten(torch.autograd.Function):
    """A subclass -> its inner tensors; the inner grads come back as one subclass grad."""

    @staticmethod
    def forward(ctx, layout: Layout, x: torch.Tensor):
        inner = flatten(x, layout)
        ctx.layout = layout
        ctx.inner_meta = [(t.shape, t.dtype, t.device) for t in inner]
        ctx.set_materialize_grads(False)
        # aliases: an inner tensor itself must not get this node's grad_fn
        return tuple(t.detach() for t in inner)

    @staticmethod
    def backward(ctx, *grads):
        # a subclass grad needs every inner tensor: zeros where autograd passed None
        inner = [g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
                 for g, (shape, dtype, device) in zip(grads, ctx.inner_meta, strict=True)]
        return None, unflatten(ctx.layout, iter(inner))


class _Unflatten(torch.autograd.Function):
    """Inner tensors -> the subclass output; its grad is flattened back to inner grads."""

    @staticmethod
    def forward(ctx, layout: Layout, *inner):
        ctx.layout = layout
        ctx.set_materialize_grads(False)
        return unflatten(layout, iter([t.detach() for t in inner]))

    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return (None,) * (1 + ctx.layout.num_tensors)
        if type(grad) is not ctx.layout.cls:
            raise RuntimeError(
                f"kiln: the grad of a compiled {ctx.layout.cls.__qualname__} output is a "
                f"{type(grad).__qualname__}; only a grad of the output's own subclass can be "
                "passed back through the compiled graph")
        return (None, *flatten(grad, layout_of(grad)))
