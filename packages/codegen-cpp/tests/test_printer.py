"""Index expressions printed as C keep their meaning (operator precedence included)."""

import itertools

import pytest
import sympy
from kiln_codegen_cpp.printer import cexpr
from kiln_loopir.sizevars import FloorDiv, ModularIndexing

s0, s1, i0 = sympy.symbols("s0 s1 i0", integer=True, positive=True)

CASES = [
    FloorDiv(s0 * s1, 2 * s0),  # printed once as `s0*s1 / 2*s0`: divided by 2, times s0
    FloorDiv(i0 + s1, s0 + 1),
    ModularIndexing(i0 * s1 + 3, 2 * s0, s1 + 1),
    sympy.Mod(i0 * s1, 2 * s0),
    i0 * FloorDiv(s0 * s1, 2 * s0) + 1,
]


def _reference(expr, env):
    """Python's exact value (floor division on non-negative ints, as loopir guarantees)."""
    return int(expr.subs(env).doit()) if not expr.free_symbols - set(env) else None


@pytest.mark.parametrize("expr", CASES, ids=str)
def test_c_text_evaluates_like_sympy(expr):
    text = cexpr(expr)
    for a, b, c in itertools.product([1, 2, 3, 7], [2, 5, 8], [0, 1, 6]):
        env = {s0: a, s1: b, i0: c}
        want = _reference(expr, env)
        # C's `/` and `%` on non-negative int64 are Python's `//` and `%`, with the same
        # precedence relative to `*` and `+`.
        got = eval(text.replace("/", "//"), {}, {"s0": a, "s1": b, "i0": c})
        assert got == want, f"{text} at {env}: {got} != {want}"
