"""What every codegen's index printer shares: loopir's index expressions are integer
arithmetic, so a printer for a C-like language differs only in its floor-division operator
and how it spells ``min``/``max``.

loopir guarantees every sub-expression of an index is >= 0 except under ``Min``/``Max``, so
``FloorDiv`` prints as the language's truncating division and ``ModularIndexing`` as that
division and ``%``. Operands of ``/`` and ``%`` are parenthesized unless atomic (``a*b / 2*c``
would divide by 2 only). Anything that is not integer arithmetic (a Rational, a float) is an
error naming the expression.
"""

from __future__ import annotations

__all__ = ["IntegerIndexPrinting"]


class IntegerIndexPrinting:
    """Mixin for a SymPy printer (put it before the printer class). A subclass sets
    ``floordiv_op`` and implements ``_min_of(a, b)`` / ``_max_of(a, b)`` on printed operands."""

    floordiv_op = "/"

    def _min_of(self, a: str, b: str) -> str:
        raise NotImplementedError

    def _max_of(self, a: str, b: str) -> str:
        raise NotImplementedError

    def _print_Rational(self, e):
        raise ValueError(f"non-integer index expression {e} (use FloorDiv)")

    def _print_Float(self, e):
        raise ValueError(f"non-integer index expression {e}")

    def _operand(self, e) -> str:
        """An operand of ``/`` or ``%``: parenthesized unless a symbol or a non-negative
        integer."""
        text = self._print(e)
        return text if (e.is_Symbol or e.is_Integer) and not text.startswith("-") else f"({text})"

    def _print_FloorDiv(self, e):
        a, b = e.args
        return f"({self._operand(a)} {self.floordiv_op} {self._operand(b)})"

    def _print_ModularIndexing(self, e):
        x, d, m = e.args
        if d == 1:
            return f"({self._operand(x)} % {self._operand(m)})"
        return f"(({self._operand(x)} {self.floordiv_op} {self._operand(d)}) % {self._operand(m)})"

    def _print_Mod(self, e):
        a, b = e.args
        return f"({self._operand(a)} % {self._operand(b)})"

    def _fold(self, args, pair) -> str:
        parts = [self._print(a) for a in args]
        out = parts[0]
        for p in parts[1:]:
            out = pair(out, p)
        return out

    def _print_Min(self, e):
        return self._fold(e.args, self._min_of)

    def _print_Max(self, e):
        return self._fold(e.args, self._max_of)

    def _print_floor(self, e):
        return self._print(e.args[0])  # integer argument (sympy keeps floor only of non-integers)
