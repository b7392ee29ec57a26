"""The opcode handler table: ``@handler("BINARY_OP", versions=(3, 11), ...)``.

A handler is ``fn(tx, inst)``; it reads and writes ``tx.stack`` / ``tx.symbolic_locals`` and
may raise ``Unsupported``.  ``versions`` names the CPython versions it covers: one
``(major, minor)`` pair, several pairs, or None for every supported version.  The running
version comes from ``kiln_frontend.bytecode.versions`` (the one module that knows it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..bytecode import versions as _versions
from ..exc import Unsupported

SUPPORTED_VERSIONS: tuple[tuple[int, int], ...] = _versions.SUPPORTED_VERSIONS

Handler = Callable[..., None]

#: opname -> {(major, minor): handler}
_HANDLERS: dict[str, dict[tuple[int, int], Handler]] = {}


def _normalize(spec) -> tuple[tuple[int, int], ...]:
    if spec is None:
        return SUPPORTED_VERSIONS
    if isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(x, int) for x in spec):
        return (spec,)
    out = tuple(tuple(v) for v in spec)
    for v in out:
        if v not in SUPPORTED_VERSIONS:
            raise ValueError(f"unsupported Python version {v} in handler registration")
    return out  # type: ignore[return-value]


def handler(*opnames: str, versions: tuple | Iterable[tuple[int, int]] | None = None):
    """Register ``fn`` as the handler of ``opnames`` on ``versions``."""
    vs = _normalize(versions)

    def deco(fn: Handler) -> Handler:
        for op in opnames:
            table = _HANDLERS.setdefault(op, {})
            for v in vs:
                if v in table and table[v] is not fn:
                    raise ValueError(f"two handlers for {op} on Python {v[0]}.{v[1]}: "
                                     f"{table[v].__qualname__} and {fn.__qualname__}")
                table[v] = fn
        return fn

    return deco


def lookup(opname: str) -> Handler:
    """The handler for ``opname`` on the running Python, or ``Unsupported`` naming it."""
    table = _HANDLERS.get(opname)
    if table is not None:
        fn = table.get(_versions.PY_VERSION)
        if fn is not None:
            return fn
    v = _versions.PY_VERSION
    raise Unsupported(f"opcode {opname} is not supported (Python {v[0]}.{v[1]})")


def handled_opnames(version: tuple[int, int] | None = None) -> set[str]:
    v = version or _versions.PY_VERSION
    return {op for op, table in _HANDLERS.items() if v in table}
