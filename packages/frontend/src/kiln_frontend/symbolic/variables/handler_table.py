"""A table of trace-time handlers keyed by the Python callable they stand for (``len``,
``operator.add``...).

One handler per callable: a second registration is refused, so two modules cannot silently
fight over what a builtin or an operator means while tracing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def _name_of(key: Any) -> str:
    module = getattr(key, "__module__", None)
    if module == "_operator":  # the C half of the operator module
        module = "operator"
    name = getattr(key, "__qualname__", None) or repr(key)
    return f"{module}.{name}" if module not in (None, "builtins") else name


class HandlerTable:
    """Callable -> handler.  ``register(*keys)`` is a decorator; ``get`` returns None for a
    callable without a handler (the caller decides what that means and says so)."""

    def __init__(self, what: str):
        self.what = what
        self._handlers: dict[Any, Callable[..., Any]] = {}

    def register(self, *keys: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: the decorated function handles each of ``keys``."""

        def deco(handler: Callable[..., Any]) -> Callable[..., Any]:
            for key in keys:
                self.add(key, handler)
            return handler

        return deco

    def add(self, key: Any, handler: Callable[..., Any]) -> None:
        old = self._handlers.get(key)
        if old is not None:
            raise ValueError(f"{self.what}: {_name_of(key)} already has a handler "
                             f"({old.__qualname__}); refusing {handler.__qualname__}")
        self._handlers[key] = handler

    def get(self, key: Any) -> Callable[..., Any] | None:
        return self._handlers.get(key)

    def __contains__(self, key: Any) -> bool:
        return key in self._handlers

    def __iter__(self) -> Iterator[Any]:
        return iter(self._handlers)

    def __len__(self) -> int:
        return len(self._handlers)

    def __repr__(self) -> str:
        names = ", ".join(sorted(_name_of(k) for k in self._handlers))
        return f"HandlerTable({self.what!r}: {names})"


#: builtin -> handler(tx, args, kwargs) returning a tracker or None (not a call it knows).
#: builtins.py fills most of it, iterators.py (a layer below) adds set()/frozenset() of an
#: iterator, so the table lives here, below both
BUILTIN_CALLS = HandlerTable("builtin calls")
builtin_handler = BUILTIN_CALLS.register
