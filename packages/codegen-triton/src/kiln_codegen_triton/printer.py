"""SymPy index expressions printed as Triton (tensor integer arithmetic).

The integer arithmetic (``FloorDiv`` as ``//``, ``ModularIndexing``, ``Mod``, operands
parenthesized, Rationals and floats refused) is loopir's ``IntegerIndexPrinting``, shared with
the C++ codegen (Triton's integer ``//`` and ``%`` truncate, which equals flooring on the
non-negative operands loopir guarantees). Symbols print by a name map (loop symbols become the
kernel's index variables, size symbols its arguments).
"""

from __future__ import annotations

import sympy
from kiln_loopir.index_printing import IntegerIndexPrinting
from sympy.printing.str import StrPrinter


class TritonIndexPrinter(IntegerIndexPrinting, StrPrinter):
    """Index arithmetic as Triton: ``FloorDiv`` is ``//``, ``Min``/``Max`` are
    ``tl.minimum``/``tl.maximum``."""

    floordiv_op = "//"

    def __init__(self, names: dict[str, str] | None = None):
        super().__init__({"order": "none"})
        self.names = names or {}

    def _print_Symbol(self, e):
        return self.names.get(e.name, e.name)

    def _print_Integer(self, e):
        return str(int(e))

    def _print_Mul(self, e):
        coeff, rest = e.as_coeff_Mul()
        factors = [self._operand(f) for f in sympy.Mul.make_args(rest)]
        if coeff == -1:
            return "-" + "*".join(factors) if len(factors) == 1 else "-(" + "*".join(factors) + ")"
        if coeff != 1:
            factors.insert(0, self._operand(coeff))
        return "*".join(factors)

    def _print_Add(self, e, order=None):
        terms = list(sympy.Add.make_args(e))
        out = self._print(terms[0])
        for t in terms[1:]:
            text = self._print(t)
            out += f" - {text[1:]}" if text.startswith("-") else f" + {text}"
        return out

    def _print_Pow(self, e, rational=False):
        base, exp = e.args
        if exp.is_Integer and int(exp) > 0:
            return "(" + "*".join([self._operand(base)] * int(exp)) + ")"
        raise ValueError(f"unsupported power in index expression: {e}")

    def _min_of(self, a: str, b: str) -> str:
        return f"tl.minimum({a}, {b})"

    def _max_of(self, a: str, b: str) -> str:
        return f"tl.maximum({a}, {b})"


def texpr(expr, names: dict[str, str] | None = None) -> str:
    """Triton source of an integer index expression."""
    return TritonIndexPrinter(names).doprint(sympy.sympify(expr))
