"""OutputGraph: the FX graph being built for one frame, its inputs, the modules and
parameters its root holds, the guards, and compiling it with the backend."""

from __future__ import annotations

import contextlib
import itertools
import re
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.fx.proxy import GraphAppendingTracer

from .. import _evalframe, entry_lifetime
from ..exc import BackendCompilerFailed, Unsupported
from ..guards import Guard, GuardKind, GuardSet, TensorGuard, torch_global_state
from ..sources import KILN_GLOBAL_PREFIX, GlobalSource, Source
from .hops.subgraph import base_input
from .variables.base import VariableTracker

#: process-wide counters, as TorchDynamo numbers __compiled_fn_N / __resume_at_OFF_N
_compiled_fn_counter = itertools.count()
_global_object_counter = itertools.count()


def _run_without_hook(fn: Callable) -> Callable:
    """``fn`` wrapped to run with this thread's eval-frame hook off (the C extension's
    ``run_without_hook``, as ``eval_frame.run_without_hook``, a layer above)."""
    return _evalframe.run_without_hook(fn)


def _sanitize(name: str) -> str:
    name = re.sub(r"[^0-9a-zA-Z_]+", "_", name).strip("_")
    if not name or name[0].isdigit():
        name = "_" + name
    return name


def _contains_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)):
        return any(_contains_tensor(v) for v in value)
    if isinstance(value, dict):
        return any(_contains_tensor(v) for v in value.values())
    return False


def _argument_trackers(args: list, kwargs: dict) -> dict[int, Any]:
    """id(fake tensor) -> the op's argument tracker holding it (also inside a tuple/list
    argument: ``out=(values, indices)``), to find an argument the op returned."""
    from .variables.containers import BaseSequenceVariable
    from .variables.tensor import TensorVariable

    owners: dict[int, Any] = {}

    def visit(a):
        if isinstance(a, TensorVariable):
            owners.setdefault(id(a.example_value), a)
        elif isinstance(a, BaseSequenceVariable):
            for item in a.items:
                visit(item)

    for a in [*args, *kwargs.values()]:
        visit(a)
    return owners


def refuse_non_strided(value: Any, what: str) -> None:
    """Sparse (COO, CSR, CSC, BSR, BSC) and other non-strided tensors have no strides, so
    neither fake tensors, guards nor any backend's lowering can handle them: a graph break
    at the first one, as torch.compile breaks ("does not support sparse Tensors")."""
    for t in _tensors_in(value):
        if t.layout is not torch.strided:
            raise Unsupported(f"{what} is a {str(t.layout).replace('torch.', '')} tensor: "
                              "only strided tensors are captured (sparse tensors run eagerly)")


def _tensors_in(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors_in(v)]
    return []


def _op_name(kind: str, target: Any) -> str:
    if kind == "call_method":
        return f"Tensor.{target}"
    if kind == "call_module":
        return f"module {target}"
    mod = getattr(target, "__module__", None)
    name = getattr(target, "__name__", repr(target))
    if mod in ("_operator", "operator"):
        return f"operator.{name}"
    return f"{mod}.{name}" if mod else name


class OutputGraph:
    def __init__(self, *, f_globals: dict[str, Any], compiler_fn: Callable,
                 code_name: str = "<frame>", dynamic: bool | None = None,
                 frame_state: dict | None = None, use_shape_env: bool = False):
        self.f_globals = f_globals
        self.compiler_fn = compiler_fn
        self.started_at = time.perf_counter()  # capture time, reported by backends
        self.code_name = code_name
        self.graph = torch.fx.Graph()
        self.tracer = GraphAppendingTracer(self.graph)
        #: dynamic shapes (see shapes.py): the frame's ``dynamic`` setting, the code's
        #: frame_state (automatic dynamic), and the ShapeEnv's bookkeeping when there is one
        self.dynamic = dynamic
        self.frame_state = frame_state
        self.shape_state = None
        shape_env = None
        if use_shape_env:
            from ..shapes import KilnShapeEnv, ShapeState

            shape_env = KilnShapeEnv()
            self.shape_state = ShapeState(shape_env)
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=shape_env)
        self.guards = GuardSet()
        from .side_effects import SideEffects

        #: mutations of objects that outlive the frame, replayed after the graph
        self.side_effects = SideEffects(self)
        #: generators made by calling inlined generator functions (a paused one inside
        #: try/finally or with must run its cleanup where eager drops it: iterators.py)
        self.generators: list[Any] = []
        self.guards.add(Guard(None, GuardKind.GRAD_MODE, torch.is_grad_enabled()))
        self.guards.add(Guard(None, GuardKind.GLOBAL_STATE, torch_global_state()))
        #: (placeholder node, source, real tensor), in placeholder order
        self.graph_inputs: list[tuple[torch.fx.Node, Source, torch.Tensor]] = []
        self.source_cache: dict[Source, VariableTracker] = {}
        #: id(real object) -> (the object, kept alive; its one tracker) for objects whose
        #: identity matters (mutable containers, user objects, modules, tensors): an object
        #: reached through two sources is one tracker for the whole trace (inlined calls too)
        self.object_trackers: dict[int, tuple[Any, VariableTracker]] = {}
        self.nn_modules: dict[str, torch.nn.Module] = {}
        self._module_names: dict[int, str] = {}
        self.attr_tensors: dict[str, torch.Tensor] = {}
        self._attr_names: dict[int, str] = {}
        self.installed_globals: dict[str, Any] = {}
        #: GraphModules sent to the backend (at most one per frame today)
        self.graphs: list[torch.fx.GraphModule] = []
        self.compiled_fn_names: list[str] = []
        #: instructions interpreted so far (inlined ones included), to stop runaway loops
        self.steps = 0
        #: (id(module), parameter or buffer name) -> the tracker read in its place while
        #: ``torch.func.functional_call`` is traced (variables/functional_call.py)
        self.state_overrides: dict[tuple[int, str], VariableTracker] = {}
        #: nodes of intermediates that ``requires_grad_()`` made require grad: a graph may
        #: not return them or what derives from them (``leaks_requires_grad``)
        self.requires_grad_roots: list[torch.fx.Node] = []
        #: set on the trace that follows such a leak: ``requires_grad_()`` of an
        #: intermediate then breaks the graph (variables/tensor.py)
        self.refuse_requires_grad_ = False
        #: what the trace after an observed shortcut breaks on (``RefusalRestart``)
        self.refused: frozenset[str] = frozenset()
        #: max()/min() over tensors chosen by torch.where (variables/tensor_select.py)
        self.selections: list = []
        #: a selection was observed (``is``, ``id()``): the graph may not be compiled
        self.selection_observed = False
        #: ``t.data`` read in the graph (variables/tensor_data.py)
        self.data_takes: list = []
        #: > 0 while a higher-order operator's body is traced (hops/subgraph.trace_body)
        self.tracing_bodies = 0

    def leaks_requires_grad(self, outputs: list[VariableTracker]) -> bool:
        """Whether a graph output requires grad because of a ``requires_grad_()`` of an
        intermediate in the graph: a backend's functional trace drops that flag (kiln's
        own refuses the graph), so torch.compile breaks the graph at the call instead."""
        if not self.requires_grad_roots:
            return False
        tainted = set(self.requires_grad_roots)
        for node in self.graph.nodes:
            if node not in tainted and any(a in tainted for a in node.all_input_nodes):
                tainted.add(node)
        return any(isinstance(getattr(v, "node", None), torch.fx.Node) and v.node in tainted
                   and getattr(v.node.meta.get("example_value"), "requires_grad", False)
                   for v in outputs)

    @contextlib.contextmanager
    def overriding_module_state(self, overrides: dict[tuple[int, str], VariableTracker]):
        """Reads of these parameters/buffers give the given trackers inside the block."""
        saved = dict(self.state_overrides)
        self.state_overrides.update(overrides)
        try:
            yield
        finally:
            self.state_overrides = saved

    # -- globals ----------------------------------------------------------------------

    def install_global(self, name: str, value: Any) -> None:
        """``f_globals[name] = value``, until no cache entry's code or guards read ``name``
        (entry_lifetime.py: the entries that do are found from their code)."""
        self.f_globals[name] = value
        self.installed_globals[name] = value
        entry_lifetime.installed(self.f_globals, name)

    def install_global_object(self, prefix: str, value: Any) -> str:
        name = f"{KILN_GLOBAL_PREFIX}{prefix}_{next(_global_object_counter)}"
        self.install_global(name, value)
        return name

    def pinned_source(self, value: Any) -> Source:
        """A source for an object the frame reached without one (a method found on a class,
        a property's getter): the object itself, kept as a global.  Its identity was fixed
        by the guards on the way to it; what can still change in it (defaults, closure
        cells) is guarded through this source."""
        # named by id: the global keeps the object alive, so the id cannot be reused while
        # the name exists, and recompiles reuse the name instead of adding globals
        name = f"{KILN_GLOBAL_PREFIX}pinned_{id(value)}"
        if self.f_globals.get(name) is not value:
            self.install_global(name, value)
        return GlobalSource(name)

    # -- object identity --------------------------------------------------------------

    def tracker_for_object(self, value: Any) -> VariableTracker | None:
        """The tracker already made for this very object, or None."""
        entry = self.object_trackers.get(id(value))
        return entry[1] if entry is not None and entry[0] is value else None

    def remember_object(self, value: Any, vt: VariableTracker) -> None:
        """Make ``vt`` the tracker of ``value`` when its identity matters (mutable state)."""
        from .variables.builder import has_identity

        if has_identity(vt) and id(value) not in self.object_trackers:
            self.object_trackers[id(value)] = (value, vt)

    # -- graph inputs -----------------------------------------------------------------

    def _placeholder_name(self, source: Source) -> str:
        return _sanitize(source.short_name())

    def add_graph_input(self, source: Source, value: torch.Tensor) -> VariableTracker:
        from .. import shapes
        from .variables.tensor import TensorVariable

        if source is None:
            raise Unsupported("a tensor without a source cannot be a graph input")
        refuse_non_strided(value, f"input {source.name()}")
        dims = shapes.dynamic_dims_for(self, source, value)
        if dims and self.shape_state is None:
            raise shapes.NeedsShapeEnv(source.name())
        if dims:
            fake, dims = shapes.make_dynamic_input(self, source, value, dims)
        else:
            fake = self.fake_mode.from_tensor(value, static_shapes=True)
        self.guards.add(Guard(source, GuardKind.TENSOR_MATCH,
                              TensorGuard(value, dims, check_strides=not dims) if dims
                              else TensorGuard(value)))
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        ctx = (self.graph.inserting_after(placeholders[-1]) if placeholders
               else self.graph.inserting_before(None))
        with ctx:
            proxy = self.tracer.create_proxy("placeholder", self._placeholder_name(source), (), {})
        proxy.node.meta["example_value"] = fake
        proxy.node.meta["source"] = source
        self.graph_inputs.append((proxy.node, source, value))
        return TensorVariable(proxy, fake, source=source, class_type=type(value))

    def register_attr_tensor(self, source: Source, value: torch.Tensor) -> VariableTracker:
        """A parameter or buffer of a module: a ``get_attr`` node on the graph's root."""
        from .variables.tensor import TensorVariable

        cached = self.source_cache.get(source)
        if cached is not None:
            return cached
        refuse_non_strided(value, f"attribute {source.name()}")
        self.guard_attr_tensor(source, value)
        aliased = self.tracker_for_object(value)
        if aliased is not None and aliased.source is not None:
            # this tensor was already reached through another source: same graph value
            from ..sources import IdentitySource

            self.guards.add(Guard(IdentitySource(source, aliased.source),
                                  GuardKind.CONSTANT_MATCH, True, what="aliased tensor"))
            self.source_cache[source] = aliased
            return aliased
        name = self._attr_names.get(id(value))
        if name is None:
            name = self._free_root_name(_sanitize(source.short_name()))
            self.attr_tensors[name] = value
            self._attr_names[id(value)] = name
        proxy = self.tracer.create_proxy("get_attr", name, (), {})
        fake = self.fake_mode.from_tensor(value, static_shapes=True)
        proxy.node.meta["example_value"] = fake
        vt = TensorVariable(proxy, fake, source=source, class_type=type(value))
        self.source_cache[source] = vt
        self.remember_object(value, vt)
        return vt

    def guard_attr_tensor(self, source: Source, value: torch.Tensor) -> None:
        """A parameter or buffer the compiled code holds (a ``get_attr`` node, or one of a
        ``call_module`` module, which a backend may bake in): a tensor assigned in its place
        later (``m.b = torch.full(...)``) must recompile (ID_MATCH), and so must a change
        to it that the compiled code assumed (``p.data = other``, ``requires_grad_()``:
        TENSOR_MATCH)."""
        self.guards.add(Guard(source, GuardKind.ID_MATCH, id(value), "tensor"))
        self.guards.add(Guard(source, GuardKind.TENSOR_MATCH, TensorGuard(value)))

    def register_module(self, source: Source, module: torch.nn.Module) -> str:
        name = self._module_names.get(id(module))
        if name is not None:
            return name
        from ..sources import AttrTupleSource
        from .variables.constant import is_constant_value
        from .variables.nn_module import path_source

        for path, t in [*module.named_parameters(remove_duplicate=False),
                        *module.named_buffers(remove_duplicate=False)]:
            if t is not None:
                self.guard_attr_tensor(path_source(source, module, path), t)
        # its settings (``eps``, ``stride``, ``p``...), which the backend reads when it
        # compiles the call: one CONSTANT_MATCH on their tuple per module
        for path, sub in module.named_modules(remove_duplicate=False):
            names = tuple(sorted(k for k, v in sub.__dict__.items() if k.isidentifier()
                                 and not k.startswith("_") and k != "training"
                                 and is_constant_value(v)))
            if names:
                self.guards.add(Guard(AttrTupleSource(path_source(source, module, path), names),
                                      GuardKind.CONSTANT_MATCH,
                                      tuple(getattr(sub, k) for k in names)))
        name = self._free_root_name(_sanitize(source.short_name()))
        self.nn_modules[name] = module
        self._module_names[id(module)] = name
        return name

    def _free_root_name(self, base: str) -> str:
        """``base``, or ``base_1``, ``base_2``... : the first name no tensor or module of
        the root holds yet (they share the root's attribute namespace)."""
        name, k = base, 1
        while name in self.nn_modules or name in self.attr_tensors:
            name = f"{base}_{k}"
            k += 1
        return name

    def register_subgraph(self, prefix: str, gm: torch.fx.GraphModule) -> str:
        """A higher-order operator's captured body (symbolic/hops): a submodule of the root,
        read with ``get_attr`` (how torch's own operators take their bodies in FX)."""
        k = 0
        while f"{prefix}_{k}" in self.nn_modules or f"{prefix}_{k}" in self.attr_tensors:
            k += 1
        self.nn_modules[f"{prefix}_{k}"] = gm
        return f"{prefix}_{k}"

    # -- ops --------------------------------------------------------------------------

    def symbolic_dispatch(self):
        """With symbolic sizes, composite ops must run their Python (SymInt-aware)
        decompositions, or their C++ kernels read sizes as ints and specialize them."""
        import contextlib

        if self.shape_state is None:
            return contextlib.nullcontext()
        from torch._dispatch.python import enable_python_dispatcher

        return enable_python_dispatcher()

    def create_graph_op(self, kind: str, target: Any, args: list[VariableTracker],
                        kwargs: dict[str, VariableTracker], *,
                        allow_constant_result: bool = False,
                        mutation: bool = False) -> VariableTracker:
        """Run ``target`` on fake tensors; when the result holds tensors add the node and
        return trackers for it, else fold it to a constant (only if allowed)."""
        from .variables.constant import ConstantVariable, wrap_constant_result

        what = _op_name(kind, target)
        ex_args = [a.as_example() for a in args]
        ex_kwargs = {k: v.as_example() for k, v in kwargs.items()}
        try:
            with self.fake_mode, self.symbolic_dispatch():
                if kind == "call_function":
                    ex = target(*ex_args, **ex_kwargs)
                elif kind == "call_method":
                    ex = getattr(ex_args[0], target)(*ex_args[1:], **ex_kwargs)
                elif kind == "call_module":
                    ex = self.fake_module_call(self.nn_modules[target], ex_args, ex_kwargs)
                else:  # pragma: no cover
                    raise AssertionError(kind)
        except (DataDependentOutputException, DynamicOutputShapeException) as e:
            if self.shape_state is None:  # sizes that depend on data: unbacked symbols
                from ..shapes import NeedsShapeEnv

                raise NeedsShapeEnv(what) from e
            raise Unsupported(f"data-dependent operator {what} ({type(e).__name__})") from e
        except Unsupported:
            raise
        except Exception as e:  # noqa: BLE001
            raise Unsupported(f"{what} raised {type(e).__name__} while tracing: {e}") from e
        if mutation:
            # an in-place op run for its effect (``x[i] = v``): keep the node
            px_args = tuple(a.as_proxy() for a in args)
            px_kwargs = {k: v.as_proxy() for k, v in kwargs.items()}
            proxy = self.tracer.create_proxy(kind, target, px_args, px_kwargs)
            proxy.node.meta["example_value"] = ex
            return ConstantVariable(None)
        if not _contains_tensor(ex):
            from ..shapes import is_symbolic, wrap_symbolic

            if is_symbolic(ex):  # a size computed from symbolic sizes (x.numel(), ...)
                return wrap_symbolic(self, lambda: self.tracer.create_proxy(
                    kind, target, tuple(a.as_proxy() for a in args),
                    {k: v.as_proxy() for k, v in kwargs.items()}), ex)
            if allow_constant_result:
                return wrap_constant_result(ex, what=what)
            if ex is None and kind == "call_module":
                return ConstantVariable(None)
            raise Unsupported(f"{what} returned a {type(ex).__name__}, not a tensor")
        refuse_non_strided(ex, f"the result of {what}")
        px_args = tuple(a.as_proxy() for a in args)
        px_kwargs = {k: v.as_proxy() for k, v in kwargs.items()}
        proxy = self.tracer.create_proxy(kind, target, px_args, px_kwargs)
        owners = _argument_trackers(args, kwargs)
        same = owners.get(id(ex)) if isinstance(ex, torch.Tensor) else None
        if same is not None:
            # ``x.add_(1)``, ``torch.add(a, b, out=x)``, ``x.requires_grad_()``,
            # ``x.contiguous()``: the op returned its argument itself (fake tensors keep
            # eager's identity), so the result IS that tracker (``x.add_(1) is x``); the node
            # stays in the graph for its effect
            proxy.node.meta["example_value"] = ex
            return same
        result = self.wrap_result(proxy, ex)
        if owners and isinstance(ex, (tuple, list)) and hasattr(result, "items"):
            # ``torch.max(x, 0, out=(v, i))`` returns (v, i) themselves
            for i, e in enumerate(ex):
                if isinstance(e, torch.Tensor) and id(e) in owners:
                    result.items[i] = owners[id(e)]
        return result

    def fake_module_call(self, module: torch.nn.Module, args: list, kwargs: dict) -> Any:
        """Run a leaf module on fake tensors with FAKE parameters and buffers, so that
        in-place updates (BatchNorm's running stats) do not touch the real ones."""
        from torch.func import functional_call

        state = {name: self.fake_mode.from_tensor(t, static_shapes=True)
                 for name, t in [*module.named_parameters(remove_duplicate=False),
                                 *module.named_buffers(remove_duplicate=False)]}
        return functional_call(module, state, tuple(args), kwargs, tie_weights=False)

    def wrap_result(self, proxy: torch.fx.Proxy, ex: Any) -> VariableTracker:
        from .variables.constant import ConstantVariable, is_constant_value
        from .variables.containers import ListVariable, TupleVariable
        from .variables.tensor import TensorVariable

        proxy.node.meta["example_value"] = ex
        if isinstance(ex, torch.Tensor):
            return TensorVariable(proxy, ex)
        if isinstance(ex, (tuple, list)):
            items = []
            for i, e in enumerate(ex):
                if isinstance(e, torch.Tensor) or isinstance(e, (tuple, list)):
                    items.append(self.wrap_result(proxy[i], e))
                elif is_constant_value(e):
                    items.append(ConstantVariable.create(e))
                elif isinstance(e, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                    from ..shapes import wrap_symbolic

                    items.append(wrap_symbolic(self, lambda i=i: proxy[i], e))
                else:
                    raise Unsupported(f"graph op returned a {type(e).__name__} item")
            if isinstance(ex, list):
                return ListVariable(items)
            return TupleVariable(items, tuple_cls=type(ex))
        raise Unsupported(f"graph op returned a {type(ex).__name__}")

    # -- compiling --------------------------------------------------------------------

    def count_calls(self) -> int:
        return sum(1 for n in self.graph.nodes if n.op in ("call_function", "call_method",
                                                              "call_module"))

    def _guard_distinct_inputs(self) -> None:
        """A graph that writes in place was traced with its distinct input tensors as
        distinct values (one placeholder per tensor object): a later call passing one tensor
        for a written input and another must recompile (a backend that functionalizes would
        not see the write through the other)."""
        import operator

        def writes(node: torch.fx.Node) -> bool:
            if node.op not in ("call_method", "call_function", "call_module"):
                return False
            if node.target is operator.setitem or node.kwargs.get("inplace") is True or \
                    node.kwargs.get("out") is not None:
                return True
            name = node.target if isinstance(node.target, str) else \
                getattr(node.target, "__name__", "")
            return node.op != "call_module" and name.endswith("_") and not name.endswith("__")

        if len(self.graph_inputs) < 2:
            return
        written = {base_input(n) for n in self.graph.nodes if writes(n)}
        from ..sources import IdentitySource

        inputs = [(node, source) for node, source, _ in self.graph_inputs if source.guardable]
        for node, source in inputs:
            if node not in written:
                continue
            for other_node, other in inputs:
                if other_node is not node:
                    self.guards.add(Guard(IdentitySource(other, source),
                                          GuardKind.CONSTANT_MATCH, False,
                                          what="distinct tensors"))

    def compile_graph(self, outputs: list[VariableTracker]) -> str:
        """Finish the graph with ``outputs`` (tensor trackers), prune unused inputs, build the
        GraphModule, compile it with the backend and install it as ``__compiled_fn_<n>``."""
        from ..debug_print import debug_enabled, print_graph

        self.graph.output(tuple(v.proxy.node for v in outputs))  # type: ignore[attr-defined]
        if self.shape_state is not None:
            from ..shapes import prune_unused_size_nodes

            prune_unused_size_nodes(self.graph)
        kept = []
        for node, source, real in self.graph_inputs:
            if node.users:
                kept.append((node, source, real))
            else:
                self.graph.erase_node(node)
        self.graph_inputs = kept
        self._guard_distinct_inputs()
        for node in list(self.graph.nodes):
            if node.op == "get_attr" and not node.users:
                self.graph.erase_node(node)
        root = torch.nn.Module()
        for name, mod in self.nn_modules.items():
            root.add_module(name, mod)
        for name, t in self.attr_tensors.items():
            if isinstance(t, torch.nn.Parameter):
                root.register_parameter(name, t)
            else:
                root.register_buffer(name, t)
        self.graph.lint()
        gm = torch.fx.GraphModule(root, self.graph)
        gm.meta["kiln_code_name"] = self.code_name
        gm.meta["kiln_capture_s"] = time.perf_counter() - self.started_at  # KILN_LOGS=perf
        example_inputs = [real for _, _, real in self.graph_inputs]
        name = f"__compiled_fn_{next(_compiled_fn_counter)}"
        if debug_enabled():
            print_graph(name, self.code_name, gm)
        try:
            compiled = self.compiler_fn(gm, example_inputs)
        except Exception as e:  # noqa: BLE001
            backend = getattr(self.compiler_fn, "__name__", type(self.compiler_fn).__name__)
            raise BackendCompilerFailed(backend, e) from e
        if compiled is None or not callable(compiled):
            backend = getattr(self.compiler_fn, "__name__", type(self.compiler_fn).__name__)
            raise BackendCompilerFailed(backend, TypeError(
                f"the backend returned {compiled!r}, not a callable"))
        self.install_global(name, _run_without_hook(compiled))
        self.graphs.append(gm)
        self.compiled_fn_names.append(name)
        return name
