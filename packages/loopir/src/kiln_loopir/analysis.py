"""Analyses of loop bodies run under small ops handlers: memory dependencies, op counts."""

from __future__ import annotations

import sympy

from .ir import ComputedBuffer, MemoryDep, Reduction
from .sizevars import index_symbol, reduction_symbol, simplify_index
from .virtualized import set_ops_handler

__all__ = ["DepsHandler", "collect_deps", "body_deps", "OpCounter", "count_ops"]


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


def collect_deps(buf: ComputedBuffer):
    """(reads, writes) of a ComputedBuffer over its own symbols i*/r*."""
    d = buf.data
    idx = [index_symbol(k) for k in range(len(d.ranges))]
    vr = dict(zip(idx, d.ranges, strict=False))
    if isinstance(d, Reduction):
        ridx = [reduction_symbol(k) for k in range(len(d.reduction_ranges))]
        vr.update(zip(ridx, d.reduction_ranges, strict=False))
        h = body_deps(buf.store_body(), idx, ridx, var_ranges=vr)
    else:
        h = body_deps(buf.store_body(), idx, var_ranges=vr)
    return h.reads, h.writes


class OpCounter(DepsHandler):
    pass


def count_ops(fn, nargs_lists) -> DepsHandler:
    """Run ``fn(*nargs_lists)`` and count: ``.ops`` (math ops by name), ``.reads``."""
    h = DepsHandler()
    with set_ops_handler(h):
        fn(*nargs_lists)
    return h
