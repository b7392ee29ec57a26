"""SymPy index expressions printed as Triton (tensor integer arithmetic).

loopir guarantees every sub-expression of an index is >= 0 except under ``Min``/``Max``, so
``FloorDiv`` prints as ``//`` and ``ModularIndexing`` as ``//`` and ``%`` (Triton's integer
``//`` and ``%`` truncate, which equals flooring on non-negative operands). ``Min``/``Max``
print as ``tl.minimum``/``tl.maximum``; symbols print by a name map (loop symbols become the
kernel's index variables, size symbols its arguments).
"""

from __future__ import annotations

import sympy
from sympy.printing.str import StrPrinter


class TritonIndexPrinter(StrPrinter):
    def __init__(self, names: dict[str, str] | None = None):
        super().__init__({"order": "none"})
        self.names = names or {}

    def _print_Symbol(self, e):
        return self.names.get(e.name, e.name)

    def _print_Integer(self, e):
        return str(int(e))

    def _print_Rational(self, e):
        raise ValueError(f"non-integer index expression {e}")

    def _print_Float(self, e):
        raise ValueError(f"non-integer index expression {e}")

    def _operand(self, e) -> str:
        text = self._print(e)
        return text if (e.is_Symbol or e.is_Integer) and not text.startswith("-") else f"({text})"

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

    def _print_FloorDiv(self, e):
        a, b = e.args
        return f"({self._operand(a)} // {self._operand(b)})"

    def _print_ModularIndexing(self, e):
        x, d, m = e.args
        if d == 1:
            return f"({self._operand(x)} % {self._operand(m)})"
        return f"(({self._operand(x)} // {self._operand(d)}) % {self._operand(m)})"

    def _print_Mod(self, e):
        a, b = e.args
        return f"({self._operand(a)} % {self._operand(b)})"

    def _minmax(self, args, fn):
        parts = [self._print(a) for a in args]
        out = parts[0]
        for p in parts[1:]:
            out = f"{fn}({out}, {p})"
        return out

    def _print_Min(self, e):
        return self._minmax(e.args, "tl.minimum")

    def _print_Max(self, e):
        return self._minmax(e.args, "tl.maximum")

    def _print_floor(self, e):
        return self._print(e.args[0])


def texpr(expr, names: dict[str, str] | None = None) -> str:
    """Triton source of an integer index expression."""
    return TritonIndexPrinter(names).doprint(sympy.sympify(expr))
