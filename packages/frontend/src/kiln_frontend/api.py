"""kiln-frontend's user API: optimize, compile, run, disable, reset.

``optimize(backend)``, ``run()`` and ``disable()`` each make a *hook context*: an object that
is both a context manager (``with kiln_frontend.optimize("eager"): ...``) and a decorator
(``@kiln_frontend.optimize("eager")``) over functions, methods and ``nn.Module`` instances (a
module comes back wrapped in ``OptimizedModule``).  Inside it, this thread's eval-frame hook
is set to the context's callback:

- ``optimize``: a ``CompileCallback`` — frames are captured and compiled with the backend;
- ``run``: ``False`` — run-only (quiescence) mode: cached compiled code is used where its
  guards pass, nothing new is ever compiled;
- ``disable``: ``None`` — no hook at all.

Contexts nest; leaving one restores what was there before.  The hook is per thread.

This module imports torch only when it meets an ``nn.Module`` (so the hook and these
wrappers also work, and are tested, on an interpreter without torch).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from . import eval_frame
from .backends import backend_name, lookup_backend
from .eval_frame import compile_callback, set_eval_frame
from .logging_utils import warn_once

#: code flags of frames the hook never captures (the C hook leaves them alone)
_NOT_CAPTURED_FLAGS = (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
                       | inspect.CO_ITERABLE_COROUTINE)

_DISABLED = None  # callback value meaning "hook off"
_RUN_ONLY = False  # callback value meaning "cached code only"


def _is_module(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


class _HookContext:
    """Installs ``callback`` as this thread's eval-frame callback; decorator and context manager."""

    def __init__(self, callback: Any, kind: str):
        self.callback = callback
        self.kind = kind  # "optimize", "run" or "disable"
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"<kiln_frontend.{self.kind} context: {self.callback!r}>"

    # context manager -----------------------------------------------------------------
    def __enter__(self) -> _HookContext:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        stack.append(set_eval_frame(self.callback))
        return self

    def __exit__(self, *exc: Any) -> None:
        set_eval_frame(self._local.stack.pop())

    # decorator -----------------------------------------------------------------------
    def __call__(self, fn: Any) -> Any:
        if self.kind == "optimize":
            _register_root(fn)
        if _is_module(fn):
            return _optimized_module_class()(fn, self)
        if isinstance(fn, type):
            raise TypeError(
                f"kiln_frontend.{self.kind}() wraps functions, methods and nn.Module instances, "
                f"not the class {fn.__qualname__}; wrap an instance or the method instead"
            )
        if not callable(fn):
            raise TypeError(f"kiln_frontend.{self.kind}() needs a callable, not {type(fn).__name__}")
        return _wrap_callable(fn, self)


def root_code(obj: Any) -> tuple[Any, str] | None:
    """The code object whose frame is the root of calling ``obj`` (and a name for it).

    A module's root is its ``forward`` (an instance attribute first, else its class's); a
    function's or method's is its own code.  Other callables (partials, objects with
    ``__call__``) have none: their frames are captured by the usual rules."""
    target = obj
    if _is_module(obj):
        target = obj.__dict__.get("forward") or getattr(type(obj), "forward", None)
    func = getattr(target, "__func__", target)
    code = getattr(func, "__code__", None)
    if not isinstance(code, types.CodeType):
        return None
    what = getattr(func, "__qualname__", code.co_name)
    if _is_module(obj):
        what = f"{type(obj).__qualname__} (its forward, {what})"
    return code, what


def _register_root(obj: Any) -> None:
    """The root frame of what the user compiles is always captured, even where its code is
    in a file the hook skips (torch's ``Sequential.forward``, an FX ``GraphModule``)."""
    root = root_code(obj)
    if root is None:
        return
    code, what = root
    eval_frame.add_root_code(code)
    if code.co_flags & _NOT_CAPTURED_FLAGS:
        warn_once(("root_not_captured", id(code)),
                  f"kiln: {what} is a generator or coroutine function; kiln does not capture "
                  "those frames, so compiling it has no effect (it runs as plain Python)",
                  stacklevel=4)
        return
    eval_frame.add_capture_root(code, what)


def _wrap_callable(fn: Callable[..., Any], ctx: _HookContext) -> Callable[..., Any]:
    # A C callable (no Python frame of its own): sets this thread's callback, calls fn,
    # restores the previous callback. Binds as a method like a function does.
    wrapper = eval_frame.with_callback(ctx.callback, fn)
    functools.update_wrapper(wrapper, fn)
    wrapper._kiln_context = ctx
    wrapper._kiln_orig = fn
    if ctx.kind == "disable":
        wrapper._kiln_disabled = True
    return wrapper


def _call_module(mod: Any, *args: Any, **kwargs: Any) -> Any:
    return mod(*args, **kwargs)


def _hooked_call_root(mod: Any, ctx: _HookContext) -> Callable[..., Any]:
    """The root frame of a compiled module that has forward hooks or pre-hooks of its own:
    ``mod(*args)``, so that the hooks are inlined with ``forward`` into one graph (rooted
    at ``forward``, they would run outside the captured frame, each hook a frame and graph
    of its own). Each compiled module gets its own copy of the code, so its cache entries
    are its own, as ``forward``'s are."""
    code = _call_module.__code__.replace()
    fn = types.FunctionType(code, _call_module.__globals__, _call_module.__name__)
    if ctx.kind == "optimize":
        eval_frame.add_root_code(code)
        eval_frame.add_capture_root(code, f"{type(mod).__qualname__} (its call with its hooks)")
    return fn


_OptimizedModule: type | None = None


def _optimized_module_class() -> type:
    """OptimizedModule is an nn.Module subclass, so it is defined when torch is first needed."""
    global _OptimizedModule
    if _OptimizedModule is not None:
        return _OptimizedModule
    import torch

    class OptimizedModule(torch.nn.Module):
        """An ``nn.Module`` whose calls run its ``_orig_mod`` under a kiln hook context.

        It is a view of ``_orig_mod``, as torch's OptimizedModule is: attribute reads it
        does not have itself, stores and deletions (``cm.k = 3`` sets ``mod.k``, so a
        ``forward`` reading it sees the change through its guards) and ``training`` are
        ``_orig_mod``'s; names its class defines (``forward``, methods) stay its own.
        ``state_dict()`` and ``load_state_dict()`` are ``_orig_mod``'s (keys without a
        prefix).
        """

        #: attributes of the wrapper itself, never forwarded
        _own_attributes = frozenset({"_orig_mod", "_kiln_context", "_kiln_hooked_call",
                                     "__dict__", "__class__"})

        def __init__(self, mod: torch.nn.Module, ctx: _HookContext):
            object.__setattr__(self, "_kiln_context", ctx)
            object.__setattr__(self, "_kiln_hooked_call", None)  # made at the first hooked call
            super().__init__()
            self._orig_mod = mod

        @property
        def training(self) -> bool:  # type: ignore[override]
            mod = self.__dict__.get("_modules", {}).get("_orig_mod")
            return True if mod is None else mod.training

        @training.setter
        def training(self, value: bool) -> None:
            # (nn.Module.__init__ sets the default before _orig_mod exists: nothing to do)
            mod = self.__dict__.get("_modules", {}).get("_orig_mod")
            if mod is not None:
                mod.training = value

        def __setattr__(self, name: str, value: Any) -> None:
            if name in OptimizedModule._own_attributes or hasattr(type(self), name):
                return super().__setattr__(name, value)
            return setattr(self._orig_mod, name, value)

        def __delattr__(self, name: str) -> None:
            if name in OptimizedModule._own_attributes or hasattr(type(self), name):
                return super().__delattr__(name)
            return delattr(self._orig_mod, name)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            prev = set_eval_frame(self._kiln_context.callback)
            try:
                mod = self._orig_mod
                if mod._forward_hooks or mod._forward_pre_hooks:
                    # its own hooks run in the captured frame, as torch.compile's do
                    call = self._kiln_hooked_call
                    if call is None:
                        call = _hooked_call_root(mod, self._kiln_context)
                        object.__setattr__(self, "_kiln_hooked_call", call)
                    return call(mod, *args, **kwargs)
                return mod(*args, **kwargs)
            finally:
                set_eval_frame(prev)

        def __getattr__(self, name: str) -> Any:
            modules = self.__dict__.get("_modules")
            if modules is None or name.startswith("__"):
                raise AttributeError(name)
            if name == "_orig_mod":
                return modules["_orig_mod"]
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(modules["_orig_mod"], name)

        def state_dict(self, *args: Any, **kwargs: Any) -> Any:
            return self._orig_mod.state_dict(*args, **kwargs)

        def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
            return self._orig_mod.load_state_dict(*args, **kwargs)

        def __dir__(self) -> list[str]:
            return sorted(set(super().__dir__()) | set(dir(self._orig_mod)))

        def __reduce__(self) -> tuple:
            # pickle / torch.save: the module and how it was compiled (compiled code is not
            # saved; the copy compiles again on its first call)
            recipe = getattr(self._kiln_context, "recipe", None)
            if recipe is None:
                raise TypeError(f"cannot pickle a module compiled by {self._kiln_context!r}")
            return (_rebuild_optimized_module, (self._orig_mod, recipe))

    OptimizedModule.__module__ = __name__
    OptimizedModule.__qualname__ = "OptimizedModule"
    _OptimizedModule = OptimizedModule
    return OptimizedModule


def _rebuild_optimized_module(mod: Any, recipe: dict[str, Any]) -> Any:
    """What an ``OptimizedModule`` unpickles to: ``mod`` compiled again the same way."""
    return compile(mod, **recipe)


def __getattr__(name: str) -> Any:
    if name == "OptimizedModule":
        return _optimized_module_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------


def optimize(
    backend: str | Callable[..., Any] = "kiln",
    nopython: bool = False,
    dynamic: bool | None = None,
) -> _HookContext:
    """Capture the frames run inside it and compile their graphs with ``backend``.

    ``backend`` is a registered name (``list_backends()``) or a callable
    ``(gm, example_inputs) -> callable``; ``nopython=True`` turns every graph break into an
    ``Unsupported`` error; ``dynamic`` (None: decide automatically, True/False) is handed to
    the capture layer.  Use as ``@optimize(...)`` or ``with optimize(...):``.
    """
    if isinstance(backend, _HookContext):
        raise TypeError("optimize() takes a backend, not another optimize() context")
    compiler_fn = lookup_backend(backend)
    callback = compile_callback(
        compiler_fn, nopython=nopython, dynamic=dynamic, backend_name=backend_name(backend)
    )
    ctx = _HookContext(callback, "optimize")
    ctx.recipe = {"fullgraph": nopython, "dynamic": dynamic, "backend": backend}
    return ctx


def _accepts_options(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "options" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _with_options(
    compiler_fn: Callable[..., Any], name: str, mode: str | None, options: dict[str, Any] | None
) -> Callable[..., Any]:
    if mode is None and options is None:
        return compiler_fn
    if not _accepts_options(compiler_fn):
        raise ValueError(
            f"backend {name!r} takes no 'options' keyword, so compile(mode=..., options=...) "
            "cannot be passed to it; drop mode/options or use a backend that accepts them "
            "(e.g. 'kiln')"
        )
    opts = dict(options or {})
    if mode is not None:
        opts["mode"] = mode
    return functools.partial(compiler_fn, options=opts)


def compile(
    model: Any = None,
    *,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    backend: str | Callable[..., Any] = "kiln",
    mode: str | None = None,
    options: dict[str, Any] | None = None,
    disable: bool = False,
) -> Any:
    """torch.compile's signature over kiln's frontend.

    ``compile(fn_or_module, ...)`` returns the optimized function / ``OptimizedModule``;
    ``@compile`` and ``@compile(...)`` work as decorators.  ``fullgraph`` is ``nopython``;
    ``mode`` and ``options`` reach backends that take an ``options`` keyword (as one dict,
    ``mode`` under the key ``"mode"``); other backends raise ``ValueError`` for them.
    ``disable=True`` returns ``model`` untouched.
    """
    if model is None:

        def decorator(m: Any) -> Any:
            return compile(
                m,
                fullgraph=fullgraph,
                dynamic=dynamic,
                backend=backend,
                mode=mode,
                options=options,
                disable=disable,
            )

        return decorator
    if disable:
        return model
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"options must be a dict, not {type(options).__name__}")
    name = backend_name(backend)
    compiler_fn = _with_options(lookup_backend(backend), name, mode, options)
    callback = compile_callback(compiler_fn, nopython=fullgraph, dynamic=dynamic, backend_name=name)
    ctx = _HookContext(callback, "optimize")
    # how to make this context again: an OptimizedModule pickles as ``compile(mod, **recipe)``
    ctx.recipe = {"fullgraph": fullgraph, "dynamic": dynamic, "backend": backend, "mode": mode,
                  "options": options}
    return ctx(model)


def run(fn: Any = None) -> Any:
    """Run-only (quiescence) mode: use already compiled code where guards pass, never compile.

    ``@run``/``run(fn)`` wraps ``fn``; ``with run():`` applies to a block.
    """
    ctx = _HookContext(_RUN_ONLY, "run")
    return ctx if fn is None else ctx(fn)


def disable(fn: Any = None) -> Any:
    """Turn the eval-frame hook off: ``@disable``/``disable(fn)`` or ``with disable():``."""
    ctx = _HookContext(_DISABLED, "disable")
    return ctx if fn is None else ctx(fn)


def reset() -> None:
    """Forget everything compiled: every cache entry, skip mark, frame state and counter."""
    eval_frame.reset()


__all__ = ["compile", "disable", "optimize", "reset", "run"]
