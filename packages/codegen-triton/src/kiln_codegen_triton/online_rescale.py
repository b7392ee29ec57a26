"""The online-softmax rule: a ``sum`` of ``exp(a - w(M))`` over a row, where ``M`` is the
``max`` of ``a`` over the same row computed by an earlier node of the kernel, can share the
max's loop over the row instead of reading the row again after it.

Why it is exact: for any per-lane running max ``m`` (``m_prev`` before this chunk, ``m_new``
after), ``sum exp(a - w(M)) = sum_lanes exp(w(m_lane) - w(M)) * sum_{a in lane} exp(a - w(m_lane))``
and a lane's partial sum rescales by ``exp(w(m_prev) - w(m_new))`` when its max moves. The
rule is recognized on the IR (the node bodies), not on an aten op name: softmax, log_softmax
and logsumexp (whose shift ``w`` replaces an infinite max by 0) all match.

``trace_body`` records a node body as a small expression tree (``Expr``); ``match_online_sum``
checks the pattern; ``replay`` evaluates a tree through any ops handler with some loads bound
to given values (the codegen replays the shift ``w`` with ``M`` bound to the running lane max).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
from kiln_loopir.sizevars import symbol_kind
from kiln_loopir.virtualized import set_ops_handler


@dataclass(frozen=True)
class Expr:
    """One ops call of a traced body: ``op(*args)`` (args: Exprs, SymPy indices, dtypes, ...)."""

    op: str
    args: tuple

    def __repr__(self) -> str:
        return f"{self.op}({', '.join(map(repr, self.args))})"


class _NoMatch(Exception):
    pass


class _Tracer:
    """An ops handler that records every call as an ``Expr``."""

    def __init__(self):
        self.calls: list[Expr] = []

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)

        def op(*args):
            if name == "indirect_indexing":  # data-dependent indices: not this rule's business
                raise _NoMatch(name)
            e = Expr(name, tuple(args))
            self.calls.append(e)
            return e

        return op


def trace_body(body, outer, inner) -> list[Expr] | None:
    """The ops calls of one node body, or None when it cannot be traced."""
    t = _Tracer()
    try:
        with set_ops_handler(t):
            body(outer, inner)
    except _NoMatch:
        return None
    return t.calls


def reduced_value(calls: list[Expr] | None) -> tuple[Expr, Expr] | None:
    """(the ``reduction`` call, the ``store_reduction`` call) of a traced reduction body."""
    if not calls:
        return None
    store = calls[-1]
    if store.op != "store_reduction" or not isinstance(store.args[2], Expr) or store.args[2].op != "reduction":
        return None
    return store.args[2], store


def _walk(e):
    yield e
    if isinstance(e, Expr):
        for a in e.args:
            yield from _walk(a)


def _loads(e) -> list[Expr]:
    return [x for x in _walk(e) if isinstance(x, Expr) and x.op == "load"]


def _mentions_inner(e) -> bool:
    for x in _walk(e):
        if isinstance(x, sympy.Basic) and any(symbol_kind(s) == "r" for s in x.free_symbols):
            return True
    return False


@dataclass(frozen=True)
class OnlineSum:
    """A ``sum`` node rewritable online over the ``max`` node ``max_node`` (writing ``m_name``):
    its value is ``exp(a - shift)``, ``shift`` a function of ``load(m_name)`` only."""

    max_node: int
    m_name: str
    a: Expr
    shift: Expr
    reduction: Expr
    store: Expr

    @property
    def shift_is_max(self) -> bool:
        """``w(M) = M``: the shift is the max itself (softmax and log_softmax; logsumexp's
        is not), so ``w(M)`` is -inf exactly when every entry of the row is."""
        return self.shift.op == "load"


def match_online_sum(sum_calls, max_calls, max_node: int, m_name: str) -> OnlineSum | None:
    """The rule's check (see the module docstring); None when the bodies do not match."""
    red_sum, red_max = reduced_value(sum_calls), reduced_value(max_calls)
    if red_sum is None or red_max is None:
        return None
    (rs, store), (rm, _) = red_sum, red_max
    if rs.args[2] != "sum" or rm.args[2] != "max":
        return None
    value = rs.args[3]
    if not (isinstance(value, Expr) and value.op == "exp" and isinstance(value.args[0], Expr)
            and value.args[0].op == "sub"):
        return None
    a, shift = value.args[0].args
    if not isinstance(a, Expr) or not isinstance(shift, Expr):
        return None
    # a is what the max reduced (so exp(a - m) <= 1: no overflow in the lanes)
    if a != rm.args[3]:
        return None
    if any(ld.args[0] == m_name for ld in _loads(a)):
        return None
    shift_loads = _loads(shift)
    if not shift_loads or any(ld.args[0] != m_name for ld in shift_loads) or _mentions_inner(shift):
        return None
    return OnlineSum(max_node, m_name, a, shift, rs, store)


def replay(e, handler, bound: dict[str, object]):
    """Evaluate the tree ``e`` by calling ``handler``'s ops; a ``load`` of a name in ``bound``
    yields the bound value instead."""
    memo: dict[int, object] = {}

    def ev(x):
        if not isinstance(x, Expr):
            return x
        if id(x) in memo:
            return memo[id(x)]
        if x.op == "load" and x.args[0] in bound:
            r = bound[x.args[0]]
        else:
            r = getattr(handler, x.op)(*[ev(a) for a in x.args])
        memo[id(x)] = r
        return r

    return ev(e)
