"""How Triton spells kiln's values and ops: ``tl`` dtypes and literals, typed values
(``TVal``), and the ops handler of the value ops (``TritonOps``) that every handler emitting
Triton lines inherits: a kernel plan's (``kernel.TritonKernel``) and a FlexAttention mod's
(``flex_attention.ModEmitter``).

The op table is ``kiln_loopir.ops_handler.CLikeOpsHandler``'s (the infix operators C and
Triton share, ``-x``) plus Triton's own spellings: ``tl.*`` where Triton has the function,
``kmath.*`` beyond it (libdevice on a GPU, ``interp_math`` under ``TRITON_INTERPRET=1``), and
the kernel's ``HELPERS`` (``_kiln_max`` propagating NaN, ``_kiln_randint64``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy
import torch
from kiln_loopir.ops_handler import (
    CLikeOpsHandler,
    bool_or,
    call,
    float_only,
    float_or,
    infix,
    prefix,
    unless_bool,
)
from kiln_loopir.virtualized import MissingOpError

TL_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "tl.float32",
    torch.float64: "tl.float64",
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.int8: "tl.int8",
    torch.int16: "tl.int16",
    torch.int32: "tl.int32",
    torch.int64: "tl.int64",
    torch.uint8: "tl.uint8",
    torch.uint16: "tl.uint16",
    torch.uint32: "tl.uint32",
    torch.uint64: "tl.uint64",
    torch.bool: "tl.int1",
}



def tl_dtype(dtype: torch.dtype) -> str:
    if dtype not in TL_DTYPES:
        raise MissingOpError(f"dtype {dtype} in a Triton kernel")
    return TL_DTYPES[dtype]


def literal(value, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "1" if value else "0"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        return repr(v)
    return str(int(value))



@dataclass
class TVal:
    """A value in the kernel: its variable, dtype and shape class ("s" scalar, "x" per outer
    point, "xr" per (outer, inner) point)."""

    name: str
    dtype: torch.dtype
    cls: str = "x"

    def __str__(self) -> str:
        return self.name



# =============================================================================================
# spellings: fn(*operand texts, dtype) -> str (dtype: the operands' dtype)
# =============================================================================================


def _floordiv(a, b, dtype):
    if dtype.is_floating_point:
        return f"tl.floor({a} / {b})"
    return (f"({a} // {b}) - ((({a} % {b}) != 0) & ((({a} < 0) ^ ({b} < 0)) != 0)).to({tl_dtype(dtype)})")


def _remainder(a, b, dtype):
    if dtype.is_floating_point:
        return f"tl.where(((kmath.fmod({a}, {b}) != 0) & ((kmath.fmod({a}, {b}) < 0) != ({b} < 0))), " \
               f"kmath.fmod({a}, {b}) + {b}, kmath.fmod({a}, {b}))"
    return f"tl.where(((({a} % {b}) != 0) & ((({a} % {b}) < 0) != ({b} < 0))), ({a} % {b}) + {b}, {a} % {b})"


def _sign(x, dtype):
    t = tl_dtype(dtype)
    return f"(({x} > 0).to({t}) - ({x} < 0).to({t}))"


def _pow(a, b, dtype):
    if dtype.is_floating_point:
        return f"kmath.pow({a}, {b})"
    return f"kmath.pow({a}.to(tl.float64), {b}.to(tl.float64)).to({tl_dtype(dtype)})"


def _logical(op):
    return lambda a, b, dtype: f"(({a} != 0) {op} ({b} != 0))"


def _equals_zero(x, dtype):
    return f"{x} == 0"


class TritonOps(CLikeOpsHandler, partial=True):
    """The value ops (index values, constants, casts, where) and the Triton spellings of the
    pure ops, shared by every handler that emits Triton lines. A handler provides
    ``value(expr, dtype, cls)``, ``join_cls``, ``_index``, ``_index_cls``, and the dicts
    ``names``, ``ind_cls``, ``op_names`` and the counter ``_ind``."""

    SPELLINGS = {
        **CLikeOpsHandler.SPELLINGS,
        "abs": unless_bool(call("tl.abs")),
        "reciprocal": prefix("1.0 / "),
        "sqrt": float_only(call("tl.sqrt")),
        "rsqrt": lambda x, dtype: f"1.0 / tl.sqrt({x})",
        "exp": float_only(call("tl.exp")),
        "exp2": call("kmath.exp2"),
        "expm1": call("kmath.expm1"),
        "log": float_only(call("tl.log")),
        "log2": call("kmath.log2"),
        "log10": call("kmath.log10"),
        "log1p": call("kmath.log1p"),
        "sin": float_only(call("tl.sin")),
        "cos": float_only(call("tl.cos")),
        "tan": call("kmath.tan"),
        "asin": call("kmath.asin"),
        "acos": call("kmath.acos"),
        "atan": call("kmath.atan"),
        "sinh": call("kmath.sinh"),
        "cosh": call("kmath.cosh"),
        "tanh": call("kmath.tanh"),
        "asinh": call("kmath.asinh"),
        "acosh": call("kmath.acosh"),
        "atanh": call("kmath.atanh"),
        "sigmoid": lambda x, dtype: f"1.0 / (1.0 + tl.exp(-{x}))",
        "erf": call("kmath.erf"),
        "erfc": call("kmath.erfc"),
        "erfinv": call("kmath.erfinv"),
        "lgamma": call("kmath.lgamma"),
        "sign": unless_bool(_sign),
        "signbit": float_or(lambda x, dtype: f"kmath.signbit({x}) != 0", lambda x, dtype: f"{x} < 0"),
        "floor": float_only(call("tl.floor")),
        "ceil": float_only(call("tl.ceil")),
        "round": float_only(call("kmath.rint")),
        "trunc": float_only(call("kmath.trunc")),
        "isnan": lambda x, dtype: f"{x} != {x}",
        "isinf": float_or(lambda x, dtype: f"tl.abs({x}) == float('inf')", lambda x, dtype: f"{x} != {x}"),
        "isfinite": float_or(lambda x, dtype: f"tl.abs({x}) < float('inf')", lambda x, dtype: f"{x} == {x}"),
        "relu": unless_bool(lambda x, dtype: f"tl.where({x} < 0, 0, {x})"),
        # bools: torch's add and mul of bools are or and and
        "add": bool_or(infix("|"), infix("+")),
        "mul": bool_or(infix("&"), infix("*")),
        "floordiv": _floordiv,
        "truncdiv": float_or(lambda a, b, dtype: f"kmath.trunc({a} / {b})", infix("//")),
        "remainder": _remainder,
        "fmod": float_or(call("kmath.fmod"), infix("%")),
        "pow": _pow,
        "atan2": call("kmath.atan2"),
        "hypot": call("kmath.hypot"),
        "copysign": call("kmath.copysign"),
        "maximum": float_or(call("_kiln_max"), call("tl.maximum")),
        "minimum": float_or(call("_kiln_min"), call("tl.minimum")),
        "logical_and": _logical("&"),
        "logical_or": _logical("|"),
        "logical_xor": _logical("^"),
        "logical_not": _equals_zero,
        "bitwise_not": bool_or(_equals_zero, prefix("~")),
        "bitwise_left_shift": infix("<<"),
        "bitwise_right_shift": infix(">>"),
        # philox random numbers (kiln_loopir.philox): the offset's low 32 bits are the counter
        "rand": lambda seed, offset, dtype: f"tl.rand({seed}, ({offset}).to(tl.uint32))",
        "randn": lambda seed, offset, dtype: f"tl.randn({seed}, ({offset}).to(tl.uint32))",
        "randint64": lambda seed, offset, low, high, dtype:
            f"_kiln_randint64({seed}, ({offset}).to(tl.uint32), {low}, {high})",
    }

    def operands(self, name: str, args) -> list[TVal]:
        self.op_names[name] = None
        return [a for a in args if isinstance(a, TVal)]

    def bind(self, text: str, dtype: torch.dtype, operands: list[TVal]) -> TVal:
        return self.value(text, dtype, self.join_cls(*operands))

    def index_expr(self, expr, dtype) -> TVal:
        expr = sympy.sympify(expr)
        cls = self._index_cls(expr)
        text = self._index(expr)
        if cls == "s":
            return self.value(f"tl.full([], {text}, {tl_dtype(dtype)})", dtype, "s")
        return self.value(f"({text}).to({tl_dtype(dtype)})", dtype, cls)

    def indirect_indexing(self, x: TVal, size, check=True) -> sympy.Symbol:
        sym = sympy.Symbol(f"ind{self._ind}", integer=True, nonnegative=True)
        self._ind += 1
        size_text = self._index(sympy.sympify(size))
        v = self.value(f"tl.where({x.name} < 0, {x.name} + {size_text}, {x.name})", x.dtype, x.cls)
        self.names[sym.name] = v.name
        self.ind_cls[sym.name] = x.cls
        return sym

    def constant(self, value, dtype) -> TVal:
        return self.value(f"tl.full([], {literal(value, dtype)}, {tl_dtype(dtype)})", dtype, "s")

    def to_dtype(self, x: TVal, dtype, src_dtype=None) -> TVal:
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:
            return self.value(f"{x.name} != 0", dtype, x.cls)
        return self.value(f"{x.name}.to({tl_dtype(dtype)})", dtype, x.cls)

    def where(self, cond: TVal, a: TVal, b: TVal) -> TVal:
        return self.value(f"tl.where({cond.name}, {a.name}, {b.name})", a.dtype, self.join_cls(cond, a, b))
