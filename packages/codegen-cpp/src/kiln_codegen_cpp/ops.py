"""How C++ spells kiln's values and ops: C types and exact literals of each dtype, and the op
table of the C++ ops handler (``CppOps``, what ``CppKernel`` inherits).

The table is ``kiln_loopir.ops_handler.CLikeOpsHandler``'s (the infix operators C and Triton
share, ``-x``) plus C++'s own spellings: libm functions by operand type (``sinf`` for float,
``sin`` for double, via double for integers: ``libm``), and the prelude's ``kiln_*`` helpers
where torch's semantics differ from C's (``kiln_floordiv``, ``kiln_maximum`` propagating
NaN, ``kiln_shl`` without undefined shifts; ``prelude.py``).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import torch
from kiln_loopir.ops_handler import (
    CLikeOpsHandler,
    bool_or,
    call,
    float_only,
    prefix,
    unless_bool,
)
from kiln_loopir.ops_spec import result_dtype
from kiln_loopir.virtualized import MissingOpError

CTYPES: dict[torch.dtype, str] = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "uint16_t",
    torch.bfloat16: "uint16_t",
    torch.int8: "int8_t",
    torch.uint8: "uint8_t",
    torch.int16: "int16_t",
    torch.int32: "int32_t",
    torch.int64: "int64_t",
    torch.bool: "bool",
    torch.uint16: "uint16_t",
    torch.uint32: "uint32_t",
    torch.uint64: "uint64_t",
}
HALF = (torch.float16, torch.bfloat16)



def ctype(dtype: torch.dtype) -> str:
    try:
        return CTYPES[dtype]
    except KeyError:
        raise NotImplementedError(f"the C++ codegen does not support dtype {dtype}") from None


def _to_float(expr: str, dtype: torch.dtype) -> str:
    return f"kiln_h2f({expr})" if dtype == torch.float16 else f"kiln_bf2f({expr})"


def _from_float(expr: str, dtype: torch.dtype) -> str:
    return f"kiln_f2h({expr})" if dtype == torch.float16 else f"kiln_f2bf({expr})"


def c_literal(value, dtype: torch.dtype) -> str:
    """An exactly typed C++ literal of ``value`` as ``dtype``."""
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype in HALF:
        bits = torch.tensor(float(value), dtype=dtype).view(torch.int16).item() & 0xFFFF
        return f"((uint16_t)0x{bits:04x})"
    if dtype.is_floating_point:
        v = float(value)
        single = dtype == torch.float32
        if math.isnan(v):
            return "NAN" if single else "((double)NAN)"
        if math.isinf(v):
            s = "INFINITY" if single else "((double)INFINITY)"
            return s if v > 0 else f"(-{s})"
        text = repr(v)
        if not single:
            return text if v >= 0 else f"({text})"
        exact = struct.unpack("f", struct.pack("f", v))[0] == v
        lit = f"{text}f" if exact else f"((float){text})"
        return lit if v >= 0 else f"({lit})"
    v = int(value)
    t = ctype(dtype)
    if t == "int32_t" and -(2**31) <= v < 2**31:
        return str(v) if v >= 0 else f"({v})"
    if t == "int64_t" and v == -(2**63):
        return "(-INT64_C(9223372036854775807) - 1)"
    if t == "uint64_t":
        return f"UINT64_C({v})"
    return f"(({t}){v}{'LL' if abs(v) >= 2**31 else ''})"


@dataclass
class CppValue:
    """A typed C++ value: ``expr`` is a variable name or a literal; ``depth`` is the loop level
    where it is defined (0 = before any loop)."""

    expr: str
    dtype: torch.dtype
    depth: int = 0

    def __str__(self) -> str:
        return self.expr



# =============================================================================================
# spellings: fn(*operand texts, dtype) -> str (dtype: the operands' dtype)
# =============================================================================================


def libm(fn: str):
    """A libm function: ``sinf`` for float, ``sin`` for double, via double for integers."""

    def spell(*xs, dtype):
        if dtype == torch.float32:
            return f"{fn}f({', '.join(xs)})"
        if dtype == torch.float64:
            return f"{fn}({', '.join(xs)})"
        return f"{fn}({', '.join(f'(double){x}' for x in xs)})"

    return spell


def _recip(x, dtype):
    return f"1.0f / {x}" if dtype == torch.float32 else f"1.0 / {x}"


def _rsqrt(x, dtype):
    return f"1.0f / sqrtf({x})" if dtype == torch.float32 else f"1.0 / sqrt({x})"


def _erf(x, dtype):
    return f"kiln_erf({x})" if dtype == torch.float32 else libm("erf")(x, dtype=dtype)


def _signbit(x, dtype):
    if dtype.is_floating_point:
        return f"__builtin_signbit({x}) != 0"
    return "false" if dtype == torch.bool or not dtype.is_signed else f"{x} < 0"


def _isnan(x, dtype):
    return f"{x} != {x}" if dtype.is_floating_point else "false"


def _magnitude_vs_infinity(compare: str, otherwise: str):
    """isinf (``==``) / isfinite (``<``): ``|x|`` against infinity for float32 and float64;
    ``otherwise`` for dtypes without infinities."""
    def spell(x, dtype):
        if dtype == torch.float32:
            return f"fabsf({x}) {compare} INFINITY"
        if dtype == torch.float64:
            return f"fabs({x}) {compare} (double)INFINITY"
        return otherwise

    return spell


def _relu(x, dtype):
    zero = c_literal(0, dtype)
    return f"{x} < {zero} ? {zero} : {x}"


def _logical(op):
    return lambda a, b, dtype: f"(bool){a} {op} (bool){b}"


def _no_philox(name: str):
    def spell(*operands, dtype):
        raise MissingOpError(name)

    return spell


class CppOps(CLikeOpsHandler, partial=True):
    """The C++ spellings of the pure ops, and how they become typed C++ values. The kernel
    provides ``_emit(text, dtype, operands)`` (a CSE'd ``const`` statement at the loop level
    its operands allow) and ``to_dtype``."""

    SPELLINGS = {
        **CLikeOpsHandler.SPELLINGS,
        "abs": unless_bool(call("kiln_abs")),
        "reciprocal": _recip,
        "sqrt": libm("sqrt"),
        "rsqrt": _rsqrt,
        "exp": libm("exp"),
        "exp2": libm("exp2"),
        "expm1": libm("expm1"),
        "log": libm("log"),
        "log2": libm("log2"),
        "log10": libm("log10"),
        "log1p": libm("log1p"),
        "sin": libm("kiln_sin"),  # not builtins: see prelude.NOT_BUILTIN
        "cos": libm("kiln_cos"),
        "tan": libm("tan"),
        "asin": libm("asin"),
        "acos": libm("acos"),
        "atan": libm("atan"),
        "sinh": libm("sinh"),
        "cosh": libm("cosh"),
        "tanh": libm("tanh"),
        "asinh": libm("asinh"),
        "acosh": libm("acosh"),
        "atanh": libm("atanh"),
        "sigmoid": call("kiln_sigmoid"),
        "erf": _erf,
        "erfc": libm("erfc"),
        "erfinv": call("kiln_erfinv"),
        "lgamma": libm("lgamma"),
        "sign": unless_bool(call("kiln_sign")),
        "signbit": _signbit,
        "floor": float_only(libm("floor")),
        "ceil": float_only(libm("ceil")),
        "round": float_only(libm("nearbyint")),
        "trunc": float_only(libm("trunc")),
        "isnan": _isnan,
        "isinf": _magnitude_vs_infinity("==", "false"),
        "isfinite": _magnitude_vs_infinity("<", "true"),
        "relu": unless_bool(_relu),
        "floordiv": call("kiln_floordiv"),
        "truncdiv": call("kiln_truncdiv"),
        "remainder": call("kiln_remainder"),
        "fmod": call("kiln_fmod"),
        "pow": call("kiln_pow"),
        "atan2": libm("atan2"),
        "hypot": libm("hypot"),
        "copysign": libm("copysign"),
        "maximum": call("kiln_maximum"),
        "minimum": call("kiln_minimum"),
        "logical_and": _logical("&&"),
        "logical_or": _logical("||"),
        "logical_xor": _logical("!="),
        "logical_not": prefix("!(bool)"),
        "bitwise_not": bool_or(prefix("!"), prefix("~")),
        "bitwise_left_shift": call("kiln_shl"),
        "bitwise_right_shift": call("kiln_shr"),
        # no philox here: on CPU, random ops call eager's generator (kiln_loopir.lowerings.random)
        **{name: _no_philox(name) for name in ("rand", "randn", "randint64")},
    }

    def operands(self, name: str, args) -> list[CppValue]:
        like = next((a for a in args if isinstance(a, CppValue)), None)
        return [self._value(a, like) for a in args]

    def apply_op(self, name: str, args) -> CppValue:
        vals = self.operands(name, args)
        if vals[0].dtype not in HALF:
            return super().apply_op(name, vals)
        # never produced by lowering; compute in float and round back
        out_dtype = result_dtype(name, [v.dtype for v in vals])
        res = super().apply_op(name, [CppValue(_to_float(v.expr, v.dtype), torch.float32, v.depth)
                                      for v in vals])
        return self.to_dtype(res, out_dtype) if out_dtype in HALF else res

    def bind(self, text: str, dtype: torch.dtype, operands: list[CppValue]) -> CppValue:
        return self._emit(text, dtype, operands)

    def _value(self, x, like: CppValue | None = None) -> CppValue:
        """``x`` as a typed value: a Python scalar becomes a literal of ``like``'s dtype."""
        if isinstance(x, CppValue):
            return x
        if isinstance(x, bool):
            return CppValue(c_literal(x, torch.bool), torch.bool)
        dtype = like.dtype if like is not None else (torch.float32 if isinstance(x, float) else torch.int64)
        return CppValue(c_literal(x, dtype), dtype)

