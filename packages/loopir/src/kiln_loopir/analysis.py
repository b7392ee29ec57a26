"""Analyses of loop bodies run under small ops handlers: memory dependencies, op counts.

Bodies are plain functions calling ``ops``; nothing here knows the IR's buffer classes
(``ir.collect_deps`` applies ``body_deps`` to a ComputedBuffer), so ``ir`` builds on this."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from .sizevars import sexpr, simplify_index
from .virtualized import set_ops_handler

__all__ = ["MemoryDep", "DepsHandler", "body_deps", "OpCounter", "count_ops"]


@dataclass(frozen=True)
class MemoryDep:
    """One memory access: buffer ``name`` at ``index`` (over the group's outer symbols
    ``i0, i1, ...`` and the node's inner symbols ``r0, r1, ...``); ``mode`` is the store mode."""

    name: str
    index: sympy.Expr
    mode: str | None = None

    def __str__(self) -> str:
        m = f" ({self.mode})" if self.mode else ""
        return f"{self.name}[{sexpr(self.index)}]{m}"


class _V:
    __slots__ = ()


_VAL = _V()


class DepsHandler:
    """Records ``ops.load``/``ops.store``/``ops.store_reduction`` (buffer + simplified index)."""

    def __init__(self, var_ranges=None):
        self.reads: list[MemoryDep] = []
        self.writes: list[MemoryDep] = []
        self.var_ranges = var_ranges or {}
        self.ops: dict[str, int] = {}
        self._ind = 0
        self.indirect: list[sympy.Symbol] = []

    def _idx(self, index):
        return simplify_index(index, self.var_ranges)

    def load(self, name, index):
        self.reads.append(MemoryDep(name, self._idx(index)))
        return _VAL

    def store(self, name, index, value, mode=None):
        self.writes.append(MemoryDep(name, self._idx(index), mode))

    def store_reduction(self, name, index, value):
        self.writes.append(MemoryDep(name, self._idx(index)))

    def indirect_indexing(self, x, size, check=True):
        s = sympy.Symbol(f"ind{self._ind}", integer=True, nonnegative=True)
        self._ind += 1
        self.indirect.append(s)
        return s

    def __getattr__(self, name):
        def op(*args, **kwargs):
            self.ops[name] = self.ops.get(name, 0) + 1
            return _VAL

        return op


def body_deps(fn, *index_lists, var_ranges=None) -> DepsHandler:
    h = DepsHandler(var_ranges)
    with set_ops_handler(h):
        fn(*index_lists)
    return h


class OpCounter(DepsHandler):
    pass


def count_ops(fn, nargs_lists) -> DepsHandler:
    """Run ``fn(*nargs_lists)`` and count: ``.ops`` (math ops by name), ``.reads``."""
    h = DepsHandler()
    with set_ops_handler(h):
        fn(*nargs_lists)
    return h
