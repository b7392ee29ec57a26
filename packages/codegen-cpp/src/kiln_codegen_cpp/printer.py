"""SymPy index expressions printed as C (int64_t arithmetic).

loopir guarantees every sub-expression of an index is >= 0 except under ``Min``/``Max``, so
``FloorDiv`` prints as C ``/`` and ``ModularIndexing`` as ``/`` and ``%``. Powers with a
positive integer exponent print as multiplications; anything that is not integer arithmetic
(a Rational, a float) is an error.
"""

from __future__ import annotations

import sympy
from sympy.printing.c import C99CodePrinter


class CppIndexPrinter(C99CodePrinter):
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

    def _print_Rational(self, e):
        raise ValueError(f"non-integer index expression {e} (use FloorDiv)")

    def _print_Float(self, e):
        raise ValueError(f"non-integer index expression {e}")

    def _print_Pow(self, e):
        base, exp = e.args
        if exp.is_Integer and int(exp) > 0:
            b = self.parenthesize(base, 60)
            return "(" + "*".join([b] * int(exp)) + ")"
        raise ValueError(f"unsupported power in index expression: {e}")

    def _print_FloorDiv(self, e):
        a, b = e.args
        return f"({self._operand(a)} / {self._operand(b)})"

    def _operand(self, e) -> str:
        """An operand of C's ``/`` or ``%``: parenthesized unless atomic (``a*b / 2*c`` would
        divide by 2 only)."""
        text = self._print(e)
        return text if (e.is_Symbol or e.is_Integer) else f"({text})"

    def _print_ModularIndexing(self, e):
        x, d, m = e.args
        if d == 1:
            return f"({self._operand(x)} % {self._operand(m)})"
        return f"(({self._operand(x)} / {self._operand(d)}) % {self._operand(m)})"

    def _print_Mod(self, e):
        a, b = e.args
        return f"({self._operand(a)} % {self._operand(b)})"

    def _minmax(self, args, op):
        parts = [self._print(a) for a in args]
        out = parts[0]
        for p in parts[1:]:
            out = f"(({out}) {op} ({p}) ? ({out}) : ({p}))"
        return out

    def _print_Min(self, e):
        return self._minmax(e.args, "<")

    def _print_Max(self, e):
        return self._minmax(e.args, ">")

    def _print_floor(self, e):
        return self._print(e.args[0])  # integer argument (sympy keeps floor only of non-integers)


_printer = CppIndexPrinter()


def cexpr(expr) -> str:
    """C source of an integer index expression."""
    return _printer.doprint(sympy.sympify(expr))
