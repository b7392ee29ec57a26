"""Context managers captured into graphs: grad mode and autocast.

``with torch.no_grad():`` (``enable_grad``, ``set_grad_enabled``) records
``torch._C._set_grad_enabled(mode)`` nodes at entry and exit, and ``torch.autocast(...)``
records ``_enter_autocast(...)`` / ``_exit_autocast(ctx)`` nodes, as torch.compile does; the
graph switches the mode at run time exactly where the eager code would.  While tracing the
real mode is switched too (fake-tensor propagation of ``requires_grad`` and autocast dtypes
depends on it); the root translator undoes whatever is still active when tracing stops.

``BEFORE_WITH`` on any of these pushes a ``ContextExitVariable`` (what ``__exit__`` is);
the 3-None call at the end of the block calls it.  Functions decorated with
``@torch.no_grad()`` & co. (torch's ``context_decorator`` wrapper) are inlined inside the
context.  User context managers with Python ``__enter__``/``__exit__`` are inlined by the
``BEFORE_WITH`` handler."""

from __future__ import annotations

import types
from typing import Any

import torch

from ...exc import Unsupported
from .base import NotConstant, VariableTracker, constant_or_break
from .constant import ConstantVariable
from .raising import TracedException


def _const(v: VariableTracker, what: str) -> Any:
    return constant_or_break(v, f"{what} with a non-constant argument")


class ContextManagerVariable(VariableTracker):
    """Base: ``enter(tx)`` / ``exit(tx)`` record graph nodes and switch the real mode;
    ``undo_real()`` restores the real mode when tracing stops inside the block."""

    def enter(self, tx) -> VariableTracker:
        raise NotImplementedError

    def exit(self, tx) -> None:
        raise NotImplementedError

    def undo_real(self) -> None:
        raise NotImplementedError

    def exit_on_exception(self, tx, exc: VariableTracker | None) -> bool:
        """The block was left by an exception: True to suppress it.  torch's managers
        restore their mode the same way and never suppress it."""
        self.exit(tx)
        return False

    def var_getattr(self, tx, name: str) -> VariableTracker:
        if name == "__enter__":
            return _BoundEnter(self)
        if name == "__exit__":
            return ContextExitVariable(self)
        raise Unsupported(f"attribute {name!r} of {self.describe()}")

    @staticmethod
    def active(tx) -> list[ContextManagerVariable]:
        root = tx.root()
        if not hasattr(root, "active_contexts"):
            root.active_contexts = []
        return root.active_contexts

    def leave(self, tx) -> None:
        """Off the list of managers whose real mode tracing must undo."""
        active = self.active(tx)
        if self in active:
            active.remove(self)

    @staticmethod
    def record(tx, fn: Any, args: tuple) -> Any:
        """A graph node ``fn(*args)`` run for its effect (enter/exit of a mode, as torch.compile
        records them); its proxy, which an exit node takes as its argument."""
        proxy = tx.output.tracer.create_proxy("call_function", fn, args, {})
        proxy.node.meta["example_value"] = None
        return proxy


class _BoundEnter(VariableTracker):
    def __init__(self, ctx: ContextManagerVariable):
        super().__init__()
        self.ctx = ctx

    def call_function(self, tx, args, kwargs):
        return self.ctx.enter(tx)


class ContextExitVariable(VariableTracker):
    """The ``__exit__`` that ``BEFORE_WITH`` leaves on the stack."""

    def __init__(self, ctx: ContextManagerVariable):
        super().__init__()
        self.ctx = ctx

    def children(self):
        return [self.ctx]

    def call_function(self, tx, args, kwargs):
        if any(not (a.is_python_constant() and a.as_python_constant() is None) for a in args):
            suppress = self.ctx.exit_on_exception(tx, args[1] if len(args) > 1 else None)
            return ConstantVariable(bool(suppress))
        self.ctx.exit(tx)
        return ConstantVariable(False)

    def reconstruct(self, codegen):
        codegen(self.ctx)
        codegen.load_attr("__exit__")

    def describe(self) -> str:
        return f"ContextExitVariable({self.ctx.describe()})"


def set_grad_enabled_node(tx, mode: bool) -> None:
    """A ``torch._C._set_grad_enabled(mode)`` node (switches the tracing mode too)."""
    if torch.is_grad_enabled() == mode:
        return
    tx.output.create_graph_op("call_function", torch._C._set_grad_enabled,
                              [ConstantVariable(mode)], {}, mutation=True)
    torch._C._set_grad_enabled(mode)


class GradModeVariable(ContextManagerVariable):
    """``torch.no_grad()``, ``torch.enable_grad()``, ``torch.set_grad_enabled(mode)``.

    ``set_grad_enabled`` switches the mode when it is *created* (its ``__enter__`` does
    nothing), so it also works as a plain call."""

    _CLASSES = {torch.no_grad: False, torch.enable_grad: True}

    def __init__(self, target: bool, cls: type, *, applied_on_create: bool = False,
                 prev: bool | None = None):
        super().__init__()
        self.target = target
        self.cls = cls
        self.applied_on_create = applied_on_create
        self.prev = prev

    @classmethod
    def create(cls, tx, klass: type, args, kwargs) -> GradModeVariable:
        if klass is torch.set_grad_enabled:
            mode = args[0] if args else kwargs.get("mode")
            if mode is None:
                raise Unsupported("torch.set_grad_enabled() without a mode")
            target = bool(_const(mode, "torch.set_grad_enabled"))
            var = cls(target, klass, applied_on_create=True, prev=torch.is_grad_enabled())
            set_grad_enabled_node(tx, target)
            var.active(tx).append(var)
            return var
        if args or kwargs:
            raise Unsupported(f"{klass.__qualname__}() with arguments")
        return cls(cls._CLASSES[klass], klass)

    def python_type(self) -> type:
        return self.cls

    def enter(self, tx) -> VariableTracker:
        if not self.applied_on_create:
            self.prev = torch.is_grad_enabled()
            set_grad_enabled_node(tx, self.target)
            self.active(tx).append(self)
        return ConstantVariable(None)

    def exit(self, tx) -> None:
        set_grad_enabled_node(tx, bool(self.prev))
        self.leave(tx)

    def undo_real(self) -> None:
        torch._C._set_grad_enabled(bool(self.prev))

    def reconstruct(self, codegen):
        if self.applied_on_create:
            raise Unsupported("cannot rebuild a torch.set_grad_enabled object")
        codegen.push_null()
        codegen.load_const_object(self.cls)
        codegen.call_function(0)

    def call_function(self, tx, args, kwargs):
        """``torch.no_grad()(fn)``: a decorator applied in the frame (``@torch.no_grad()``
        on a local function): the function that runs ``fn`` in the mode."""
        if self.applied_on_create or len(args) != 1 or kwargs or \
                not callable_tracker(args[0]):
            raise Unsupported(f"call to {self.describe()}")
        return GradModeFunctionVariable(self.target, self.cls, args[0])

    def describe(self) -> str:
        return f"GradModeVariable({self.cls.__name__}, {self.target})"


def callable_tracker(v: VariableTracker) -> bool:
    """A traced Python function (not a class: torch's decorator wraps classes otherwise)."""
    try:
        return v.python_type() is types.FunctionType
    except Exception:  # noqa: BLE001 - a tracker that cannot say: not a function
        return False


class GradModeFunctionVariable(VariableTracker):
    """A function decorated in the frame with ``torch.no_grad()``/``enable_grad()``: each
    call enters the mode, inlines the function and leaves the mode (also when it raises),
    as torch's ``decorate_context`` does."""

    def __init__(self, target: bool, cls: type, fn: VariableTracker):
        super().__init__()
        self.target = target
        self.cls = cls
        self.fn = fn

    def children(self):
        return [self.fn]

    def call_function(self, tx, args, kwargs):
        return call_in_context(tx, GradModeVariable(self.target, self.cls), self.fn, args,
                               kwargs)

    def reconstruct(self, codegen):
        raise Unsupported(f"cannot rebuild a function decorated with {self.cls.__name__}() "
                          "in the frame")

    def describe(self) -> str:
        return f"GradModeFunctionVariable({self.cls.__name__}, {self.fn.describe()})"


class AutocastVariable(ContextManagerVariable):
    """``torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None)`` and the
    per-device ``torch.{cpu,cuda}.amp.autocast``."""

    def __init__(self, cls: type, device_type: str, dtype: Any, enabled: bool,
                 cache_enabled: Any):
        super().__init__()
        self.cls = cls
        self.device_type = device_type
        self.dtype = dtype
        self.enabled = enabled
        self.cache_enabled = cache_enabled
        self.real: Any = None
        self.node: Any = None

    @classmethod
    def create(cls, tx, klass: type, args, kwargs) -> AutocastVariable:
        import inspect

        cargs = [_const(a, "autocast") for a in args]
        ckwargs = {k: _const(v, "autocast") for k, v in kwargs.items()}
        # build a real one now (validates the arguments, resolves defaults)
        probe = klass(*cargs, **ckwargs)
        params = inspect.signature(klass.__init__).parameters
        cache = ckwargs.get("cache_enabled") if "cache_enabled" in params else None
        return cls(klass, probe.device, probe.fast_dtype, probe._enabled, cache)

    def python_type(self) -> type:
        return self.cls

    def enter(self, tx) -> VariableTracker:
        from torch.amp.autocast_mode import _enter_autocast

        vals = (self.device_type, self.dtype, self.enabled, self.cache_enabled)
        self.node = self.record(tx, _enter_autocast, vals)
        self.real = torch.amp.autocast(*vals)
        self.real.__enter__()
        self.active(tx).append(self)
        return ConstantVariable(None)

    def exit(self, tx) -> None:
        from torch.amp.autocast_mode import _exit_autocast

        self.record(tx, _exit_autocast, (self.node,))
        self.undo_real()
        self.leave(tx)

    def undo_real(self) -> None:
        if self.real is not None:
            self.real.__exit__(None, None, None)
            self.real = None

    def reconstruct(self, codegen):
        # torch.autocast(device_type, dtype, enabled, cache_enabled)
        codegen.push_null()
        codegen.load_const_object(torch.autocast)
        for v in (self.device_type, self.dtype, self.enabled, self.cache_enabled):
            codegen.load_const(v)
        codegen.call_function(4)

    def describe(self) -> str:
        return f"AutocastVariable({self.device_type}, {self.dtype}, {self.enabled})"


class InferenceModeVariable(ContextManagerVariable):
    """``torch.inference_mode(mode=True)``: ``_enter_inference_mode(mode)`` /
    ``_exit_inference_mode(ctx)`` nodes, as torch.compile records.  While tracing only the
    real grad mode is switched (inference mode implies no grad; fake tensors are not made
    inference tensors)."""

    def __init__(self, mode: bool):
        super().__init__()
        self.mode = mode
        self.node: Any = None
        self.prev_grad: bool | None = None

    @classmethod
    def create(cls, tx, klass: type, args, kwargs) -> InferenceModeVariable:
        mode = args[0] if args else kwargs.get("mode", ConstantVariable(True))
        return cls(bool(_const(mode, "torch.inference_mode")))

    def python_type(self) -> type:
        return torch.inference_mode

    def enter(self, tx) -> VariableTracker:
        from torch.autograd.grad_mode import _enter_inference_mode

        self.node = self.record(tx, _enter_inference_mode, (self.mode,))
        self.prev_grad = torch.is_grad_enabled()
        if self.mode:
            torch._C._set_grad_enabled(False)
        self.active(tx).append(self)
        return ConstantVariable(None)

    def exit(self, tx) -> None:
        from torch.autograd.grad_mode import _exit_inference_mode

        self.record(tx, _exit_inference_mode, (self.node,))
        self.undo_real()
        self.leave(tx)

    def undo_real(self) -> None:
        if self.prev_grad is not None:
            torch._C._set_grad_enabled(self.prev_grad)
            self.prev_grad = None

    def reconstruct(self, codegen):
        codegen.push_null()
        codegen.load_const_object(torch.inference_mode)
        codegen.load_const(self.mode)
        codegen.call_function(1)

    def describe(self) -> str:
        return f"InferenceModeVariable({self.mode})"


def _enter_sdpa_kernel(backends: list[int], set_priority: bool) -> Any:
    """What ``sdpa_kernel(backends)`` does on entry, as one graph node: the previous
    backends (and priority order) for ``_exit_sdpa_kernel``."""
    from torch.nn.attention import SDPBackend, _cur_sdpa_kernel_backends, _sdpa_kernel

    prev = (_cur_sdpa_kernel_backends(with_priority=set_priority),
            torch._C._get_sdp_priority_order())
    _sdpa_kernel([SDPBackend(b) for b in backends], set_priority)
    return prev


def _exit_sdpa_kernel(prev: Any, set_priority: bool) -> None:
    from torch.nn.attention import _sdpa_kernel

    _sdpa_kernel(prev[0], set_priority)
    if set_priority:
        torch._C._set_sdp_priority_order(prev[1])


class SdpaKernelVariable(ContextManagerVariable):
    """``torch.nn.attention.sdpa_kernel(backends, set_priority=False)``: enter/exit graph
    nodes that switch the enabled attention backends where eager does (the fake
    propagation does not depend on them, so tracing switches nothing)."""

    def __init__(self, backends: list[int], set_priority: bool):
        super().__init__()
        self.backends = backends
        self.set_priority = set_priority
        self.node: Any = None

    @classmethod
    def create(cls, tx, args, kwargs) -> SdpaKernelVariable:
        from torch.nn.attention import SDPBackend

        def real(v):
            v = tx.realize(v)
            try:
                return v.as_python_constant()
            except NotConstant:
                if hasattr(v, "value"):
                    return v.value
                if hasattr(v, "items"):
                    return [real(i) for i in v.items]
                raise Unsupported("sdpa_kernel with a non-constant argument") from None

        names = ("backends", "set_priority")
        values = dict(zip(names, args, strict=False)) | dict(kwargs)
        backends = real(values["backends"]) if "backends" in values else None
        set_priority = bool(real(values["set_priority"])) if "set_priority" in values \
            else False
        if isinstance(backends, SDPBackend):
            backends = [backends]
        if not isinstance(backends, (list, tuple)) or \
                not all(isinstance(b, SDPBackend) for b in backends):
            raise Unsupported(f"sdpa_kernel({backends!r})")
        return cls([int(b) for b in dict.fromkeys(backends)], set_priority)

    def python_type(self) -> type:
        import contextlib

        return contextlib._GeneratorContextManager

    def enter(self, tx) -> VariableTracker:
        from .containers import ConstDictVariable

        self.node = self.record(tx, _enter_sdpa_kernel, (self.backends, self.set_priority))
        return ConstDictVariable({})

    def exit(self, tx) -> None:
        self.record(tx, _exit_sdpa_kernel, (self.node, self.set_priority))

    def undo_real(self) -> None:
        pass  # nothing real was switched

    def reconstruct(self, codegen):
        raise Unsupported("cannot rebuild an sdpa_kernel context object")

    def describe(self) -> str:
        return f"SdpaKernelVariable({self.backends})"


class _RealStateUndo(ContextManagerVariable):
    """What tracing switched for real with no ``with`` to switch it back (a plain
    ``torch.set_default_dtype(...)`` call): restored when tracing stops; the graph's own
    node does it for real when the graph runs."""

    def __init__(self, restore: Any):
        super().__init__()
        self.restore = restore

    def undo_real(self) -> None:
        self.restore()


def _set_default_dtype(tx, args, kwargs) -> VariableTracker:
    """``torch.set_default_dtype(d)``: a graph node (factories after it in the graph read
    the default at run time) and, while tracing, the real default (their fake results)."""
    if len(args) != 1 or kwargs:
        raise Unsupported("torch.set_default_dtype with keyword arguments")
    dtype = _const(args[0], "torch.set_default_dtype")
    prev = torch.get_default_dtype()
    tx.output.create_graph_op("call_function", torch.set_default_dtype,
                              [ConstantVariable(dtype)], {}, mutation=True)
    torch.set_default_dtype(dtype)
    ContextManagerVariable.active(tx).append(
        _RealStateUndo(lambda: torch.set_default_dtype(prev)))
    return ConstantVariable(None)


def _torch_check(tx, args, kwargs) -> VariableTracker:
    """``torch._check(cond, message)`` with a condition known while tracing: a check that
    passes folds away (as under torch.compile); one that fails, or a condition known only
    at run time, is a graph break (Python raises eager's error)."""
    cond = args[0] if args else kwargs.get("cond")
    try:
        value = tx.realize(cond).as_python_constant() if cond is not None else None
    except NotConstant:
        raise Unsupported("torch._check on a value known only at run time") from None
    if value is True:
        return ConstantVariable(None)
    raise Unsupported("torch._check whose condition fails")


#: torch functions traced by a handler: global-state switches captured as graph nodes,
#: checks folded; fn -> handler(tx, args, kwargs) (consulted before torch.py's list of
#: blocked global-state calls; a Python function needs a trace_rules GRAPH rule to get here)
GLOBAL_STATE_CALLS: dict[Any, Any] = {
    torch.set_default_dtype: _set_default_dtype,
    torch._check: _torch_check,
}


def context_manager_classes() -> dict[type, Any]:
    """class -> factory(tx, cls, args, kwargs) for the context managers captured."""
    table: dict[type, Any] = {
        torch.no_grad: GradModeVariable.create,
        torch.enable_grad: GradModeVariable.create,
        torch.set_grad_enabled: GradModeVariable.create,
        torch.autocast: AutocastVariable.create,
        torch.inference_mode: InferenceModeVariable.create,
    }
    for mod in ("cpu", "cuda"):
        amp = getattr(getattr(torch, mod, None), "amp", None)
        klass = getattr(amp, "autocast", None)
        if isinstance(klass, type):
            table[klass] = AutocastVariable.create
    return table


CONTEXT_MANAGER_CLASSES = context_manager_classes()


def enter_for_reentry(ctx: Any) -> Any:
    """``ctx.__enter__()``, then its bound ``__exit__``: what a re-entered autocast block
    leaves in the ``__exit__`` stack slot (``translator.break_reentering_with``)."""
    ctx.__enter__()
    return ctx.__exit__


def wrap_context_object(tx, value: Any) -> VariableTracker | None:
    """A context-manager object from outside the frame (``ctx = torch.no_grad()`` made
    elsewhere): a grad-mode one is refused, so the frame runs as is, as under
    torch.compile (which does not enter managers made outside the compiled region); its
    ``__enter__`` would set ``prev`` on the shared object besides."""
    if type(value) in (torch.no_grad, torch.enable_grad):
        raise Unsupported(f"`with` on a {type(value).__qualname__} object made outside the "
                          "frame")
    return None


def decorated_context_call(tx, fn, source, args, kwargs) -> VariableTracker | None:
    """``@torch.no_grad()``-style decorated functions (torch's ``context_decorator``
    wrapper ``decorate_context``): enter the context, inline the wrapped function, exit."""
    import torch.utils._contextlib as ctxlib

    code = _decorate_context_code(ctxlib)
    if fn.__code__ is _decorate_autocast_code():
        return _autocast_decorated_call(tx, fn, source, args, kwargs)
    if code is None or fn.__code__ is not code:
        return None
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False))
    if "ctx_factory" not in cells or "func" not in cells:
        return None
    # the context object, without calling the factory (set_grad_enabled's constructor
    # switches the mode at once)
    factory_fn = cells["ctx_factory"].cell_contents
    if getattr(factory_fn, "__name__", None) == "clone" and hasattr(factory_fn, "__self__"):
        ctx = factory_fn.__self__
    elif getattr(factory_fn, "__closure__", None) and "ctx" in factory_fn.__code__.co_freevars:
        ctx = factory_fn.__closure__[factory_fn.__code__.co_freevars.index("ctx")].cell_contents
    else:
        raise Unsupported("function decorated with an unknown context factory")
    factory = CONTEXT_MANAGER_CLASSES.get(type(ctx))
    if factory is None or type(ctx) is torch.set_grad_enabled:
        if type(ctx) is torch.set_grad_enabled:
            var: ContextManagerVariable = GradModeVariable(bool(ctx.mode), type(ctx))
        else:
            raise Unsupported(f"function decorated with {type(ctx).__qualname__}")
    elif isinstance(ctx, torch.amp.autocast):
        var = AutocastVariable(type(ctx), ctx.device, ctx.fast_dtype, ctx._enabled,
                               getattr(ctx, "_cache_enabled", None))
    else:
        var = GradModeVariable(GradModeVariable._CLASSES[type(ctx)], type(ctx))
    from ...sources import cell_contents_source

    index = fn.__code__.co_freevars.index("func")
    func_src = cell_contents_source(source, index) if source is not None else None
    func = tx.wrap_value(cells["func"].cell_contents, func_src)
    return call_in_context(tx, var, func, args, kwargs)


def call_in_context(tx, ctx: ContextManagerVariable, fn: VariableTracker, args, kwargs):
    """``fn(*args, **kwargs)`` inlined inside ``ctx``, as ``with ctx: return fn(...)``: the
    context is left also when the call raises (to a handler of the frame; before, a caught
    exception left the grad mode switched for the rest of the graph and after it)."""
    ctx.enter(tx)
    try:
        result = tx.call_function(fn, list(args), dict(kwargs))
    except TracedException:
        ctx.exit(tx)
        raise
    ctx.exit(tx)
    return result


def _wrapped_func(tx, fn, source) -> VariableTracker:
    """The function a decorator wrapper holds in its ``func`` cell, with its source."""
    from ...sources import cell_contents_source

    index = fn.__code__.co_freevars.index("func")
    func_src = cell_contents_source(source, index) if source is not None else None
    return tx.wrap_value(fn.__closure__[index].cell_contents, func_src)


def _autocast_decorated_call(tx, fn, source, args, kwargs) -> VariableTracker:
    """A ``@torch.autocast(...)``-decorated function (torch's ``decorate_autocast``: ``with
    autocast_instance: return func(...)``): the call inlined inside that autocast."""
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False))
    if "autocast_instance" not in cells or "func" not in cells:
        raise Unsupported("a decorate_autocast wrapper without its cells")
    ctx = cells["autocast_instance"].cell_contents
    if not isinstance(ctx, torch.amp.autocast):
        raise Unsupported(f"function decorated with {type(ctx).__qualname__}")
    var = AutocastVariable(type(ctx), ctx.device, ctx.fast_dtype, ctx._enabled,
                           getattr(ctx, "_cache_enabled", None))
    return call_in_context(tx, var, _wrapped_func(tx, fn, source), args, kwargs)


def _decorate_autocast_code() -> Any:
    from torch.amp import autocast_mode

    for const in autocast_mode.autocast_decorator.__code__.co_consts:
        if getattr(const, "co_name", None) == "decorate_autocast":
            return const
    return None


_DECORATE_CODE: list = []


def _decorate_context_code(ctxlib) -> Any:
    if not _DECORATE_CODE:
        code = None
        for const in ctxlib.context_decorator.__code__.co_consts:
            if getattr(const, "co_name", None) == "decorate_context":
                code = const
        _DECORATE_CODE.append(code)
    return _DECORATE_CODE[0]
