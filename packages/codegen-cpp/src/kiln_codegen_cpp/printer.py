"""SymPy index expressions printed as C (int64_t arithmetic).

The integer arithmetic (``FloorDiv`` as C ``/``, ``ModularIndexing``, ``Mod``, operands
parenthesized, Rationals and floats refused) is loopir's ``IntegerIndexPrinting``, shared with
the Triton codegen. Powers with a positive integer exponent print as multiplications.
"""

from __future__ import annotations

import sympy
from kiln_loopir.index_printing import IntegerIndexPrinting
from sympy.printing.c import C99CodePrinter


class CppIndexPrinter(IntegerIndexPrinting, C99CodePrinter):
    """Index arithmetic as C: ``FloorDiv`` is ``/``, ``Min``/``Max`` are conditionals."""

    def __init__(self):
        super().__init__({"order": "none"})

    def _print_Integer(self, e):
        v = int(e)
        if -(2**31) <= v < 2**31:
            return str(v)
        if v == -(2**63):
            return "(-INT64_C(9223372036854775807) - 1)"
        return f"INT64_C({v})"

    def _print_Symbol(self, e):
        return e.name

    def _print_Pow(self, e):
        base, exp = e.args
        if exp.is_Integer and int(exp) > 0:
            b = self.parenthesize(base, 60)
            return "(" + "*".join([b] * int(exp)) + ")"
        raise ValueError(f"unsupported power in index expression: {e}")

    def _min_of(self, a: str, b: str) -> str:
        return f"(({a}) < ({b}) ? ({a}) : ({b}))"

    def _max_of(self, a: str, b: str) -> str:
        return f"(({a}) > ({b}) ? ({a}) : ({b}))"


_printer = CppIndexPrinter()


def cexpr(expr) -> str:
    """C source of an integer index expression."""
    return _printer.doprint(sympy.sympify(expr))
