"""The backend registry.

A backend is anything with torch.compile's backend signature::

    backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable

Backends come from three places, looked up in this order:

1. ``register_backend`` — in-process registration (decorator or call);
2. the entry-point group ``kiln.backends`` — how installed packages (kiln's own and third
   parties') offer backends. An entry point ``name = "pkg.module:function"`` makes ``name``
   usable as ``optimize("name")``/``compile(backend="name")``. Entry points are read lazily:
   nothing is imported until a backend of that name is looked up;
3. a callable passed directly — used as is.

Built in: ``eager`` (returns ``gm.forward``: runs the captured graph with plain PyTorch).
``kiln`` (the full compiler) is offered by the ``kiln`` distribution through the entry point.

``lookup_backend`` raises ``InvalidBackend`` for an unknown name, listing the known ones.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any, overload

from .exc import KilnError

ENTRY_POINT_GROUP = "kiln.backends"

CompilerFn = Callable[..., Any]

class InvalidBackend(KilnError, ValueError):
    """An unknown backend name (the message lists the known ones)."""

    def __init__(self, name: str, known: list[str]):
        self.name = name
        self.known = known
        hint = ""
        if name == "kiln":
            hint = " (the 'kiln' backend comes with the 'kiln' distribution: pip install kiln)"
        super().__init__(f"unknown backend {name!r}{hint}; known backends: {', '.join(known) or '(none)'}")


_registered: dict[str, CompilerFn] = {}
_entry_points: dict[str, importlib.metadata.EntryPoint] | None = None


def _scan_entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    global _entry_points
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep)  # first one on sys.path wins
    _entry_points = found
    return found


@overload
def register_backend(compiler_fn: CompilerFn, name: str | None = None, *, replace: bool = False) -> CompilerFn: ...
@overload
def register_backend(compiler_fn: str | None = None, name: str | None = None, *, replace: bool = False) -> Callable[[CompilerFn], CompilerFn]: ...


def register_backend(compiler_fn=None, name=None, *, replace=False):
    """Register a backend under ``name`` (default: the function's ``__name__``).

    All of these work::

        @register_backend
        def my_backend(gm, example_inputs): ...

        @register_backend(name="fast")          # or @register_backend("fast")
        def my_backend(gm, example_inputs): ...

        register_backend(my_backend, name="fast")

    Registering a different function under a taken name raises ``ValueError`` unless
    ``replace=True``.  Returns the function (so it stays usable as a decorator).
    """
    if isinstance(compiler_fn, str):
        compiler_fn, name = None, compiler_fn
    if compiler_fn is None:

        def decorator(fn: CompilerFn) -> CompilerFn:
            return register_backend(fn, name=name, replace=replace)

        return decorator
    if not callable(compiler_fn):
        raise TypeError(f"register_backend() needs a callable backend, not {type(compiler_fn).__name__}")
    key = name or getattr(compiler_fn, "__name__", None)
    if not key:
        raise ValueError("register_backend(): give a name= for a backend without __name__")
    existing = _registered.get(key)
    if existing is not None and existing is not compiler_fn and not replace:
        raise ValueError(f"a different backend is already registered as {key!r} (pass replace=True)")
    _registered[key] = compiler_fn
    return compiler_fn


def unregister_backend(name: str) -> None:
    """Forget an in-process registration (entry points stay visible)."""
    _registered.pop(name, None)


def list_backends() -> list[str]:
    """Sorted names of every known backend: registered ones and installed entry points."""
    return sorted(set(_registered) | set(_scan_entry_points()))


def lookup_backend(backend: str | CompilerFn) -> CompilerFn:
    """The backend callable for a name (or the callable itself)."""
    if callable(backend) and not isinstance(backend, str):
        return backend
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a name or a callable, not {type(backend).__name__}")
    fn = _registered.get(backend)
    if fn is not None:
        return fn
    eps = _entry_points if _entry_points is not None and backend in _entry_points else _scan_entry_points()
    ep = eps.get(backend)
    if ep is None:
        raise InvalidBackend(backend, list_backends())
    fn = ep.load()
    if not callable(fn):
        raise TypeError(f"entry point {ep.value!r} ({ENTRY_POINT_GROUP}: {backend}) is not callable")
    _registered.setdefault(backend, fn)
    return fn


def backend_name(backend: str | CompilerFn) -> str:
    if isinstance(backend, str):
        return backend
    return getattr(backend, "__name__", type(backend).__name__)


@register_backend
def eager(gm: Any, example_inputs: list[Any]) -> Callable[..., Any]:
    """Run the captured FX graph as is (plain PyTorch): for debugging the frontend."""
    return gm.forward


__all__ = [
    "ENTRY_POINT_GROUP",
    "InvalidBackend",
    "backend_name",
    "eager",
    "list_backends",
    "lookup_backend",
    "register_backend",
    "unregister_backend",
]
