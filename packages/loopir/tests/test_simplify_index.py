"""kiln_loopir.sizevars.simplify_index: the loop-range rules, and its memo (repeated blocks of
a model ask the same questions; a memo that confused two questions would print wrong indices)."""

from __future__ import annotations

import sympy
from kiln_loopir import sizevars
from kiln_loopir.sizevars import FloorDiv, ModularIndexing, simplify_index

x0, x1 = sympy.symbols("x0 x1", integer=True, nonnegative=True)
s0 = sympy.Symbol("s0", integer=True, positive=True)


def test_loop_ranges_drop_what_cannot_happen():
    assert simplify_index(ModularIndexing(x0, 1, 64), {x0: 32}) == x0  # x0 < 32 < 64
    assert simplify_index(FloorDiv(x0, 64), {x0: 32}) == 0
    assert simplify_index(ModularIndexing(x0, 1, 64), {x0: 128}) == ModularIndexing(x0, 1, 64)
    assert simplify_index(x0 * 4 + x1, {x0: 8, x1: 1}) == x0 * 4  # a range of 1 is 0
    # a size symbol is no bound: nothing is dropped
    assert simplify_index(ModularIndexing(x0, 1, s0), {x0: s0 * 2}) == ModularIndexing(x0, 1, s0)


def test_the_memo_answers_each_question_by_its_ranges():
    sizevars._simplify_index.cache_clear()
    expr = ModularIndexing(x0 + 2 * x1, 1, 64)
    small = {x0: 2, x1: 16}  # x0 + 2*x1 <= 31 < 64
    large = {x1: 64, x0: 2}
    assert simplify_index(expr, small) == x0 + 2 * x1
    assert simplify_index(expr, large) == expr
    again = simplify_index(expr, {x1: 16, x0: 2})  # the same ranges in another order: a hit
    assert again == x0 + 2 * x1
    info = sizevars._simplify_index.cache_info()
    assert (info.hits, info.misses) == (1, 2)
