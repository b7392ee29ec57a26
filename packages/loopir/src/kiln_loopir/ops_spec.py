"""THE op set of the virtualized ``ops`` handler, declared once.

Every loop body in the IR is a Python function that calls ``ops.<name>(...)`` (see
:mod:`kiln_loopir.virtualized`). This module lists every name a body may call, with its arity,
the rule that gives its result dtype, and a reference torch implementation that the loopir
interpreter runs. A codegen implements every name listed here (``missing_ops(handler)`` says
which it lacks); calling a name the current handler lacks raises ``MissingOpError``.

Conventions every codegen can rely on
-------------------------------------
* Values are typed. Lowerings insert explicit ``ops.to_dtype`` so that the operands of every
  binary/ternary math op have the SAME dtype (type promotion happens in lowering, as eager
  does). The result dtype follows ``OpSpec.dtype_rule``:
  ``"same"`` = the dtype of the first value operand; ``"bool"`` = torch.bool;
  ``"arg"`` = the ``dtype`` argument of the op; ``"where"`` = the dtype of ``a``/``b``;
  ``"load"`` = the dtype of the buffer loaded; ``"index"`` = an index symbol (not a value);
  ``"none"`` = the op returns nothing useful; ``"float32"`` / ``"int64"`` = that dtype.
* float16/bfloat16 are never computed in: a load of a half buffer is immediately followed by
  ``ops.to_dtype(x, torch.float32)`` and a value is converted back right before ``ops.store``.
  So math ops see float32/float64, integer types or bool only. ``ops.store`` receives a value
  whose dtype IS the buffer's dtype.
* ``ops.reduction(dtype, src_dtype, reduction_type, value)``: ``value`` has dtype ``src_dtype``
  (per inner point); ``dtype`` is the accumulator/result dtype. The result is only passed to
  ``ops.store_reduction``, which converts it to the buffer's dtype (the only implicit cast in
  the IR). The body of a reduction node is always: per-point math, then ``r =
  ops.reduction(...)``, then ``ops.store_reduction(buf, index, r)``; nothing in between.
* Reduction types: ``sum``, ``prod``, ``max``, ``min`` (max/min propagate NaN like
  torch.amax/amin), ``argmax``, ``argmin`` (result int64: the row-major linear index over the
  node's inner (reduction) ranges in their given order; first occurrence wins on ties; a NaN
  counts as the maximum AND the minimum, first NaN wins, as torch), ``any``, ``all`` (bool
  value, bool result), ``welford_mean`` and ``welford_m2`` (floating value and result: the
  row's mean, and its sum of squared deviations from that mean, computed in one pass by
  Welford's update and merged across chunks/lanes with Chan's formula; an empty row gives
  mean NaN and m2 0). Two welford nodes over the same value and rows share one accumulator
  in a codegen. See ``REDUCTION_TYPES``.
* Index expressions are SymPy integer expressions over loop symbols ``i*``/``r*``, size symbols
  ``s*`` and indirect symbols ``ind*`` (see ``indirect_indexing``), built from Integer, Symbol,
  Add, Mul, ``FloorDiv``, ``ModularIndexing`` (kiln_loopir.sizevars), ``sympy.Min`` and
  ``sympy.Max``. Every sub-expression is >= 0 except where ``Min``/``Max`` clamp it, so C
  integer division equals floor division.
* ``ops.indirect_indexing(x, size, check=True)`` turns an integer VALUE into an index symbol
  (``ind0``, ``ind1``, ...) that later index expressions may use; negative values wrap by
  ``size`` (``x < 0 ? x + size : x``). ``check`` asks for a bounds check (codegens may skip).
* ``ops.store(name, index, value, mode=None)``: mode ``None`` writes; ``"atomic_add"`` adds the
  value to what is there (scatter_add / index_put(accumulate=True)), and must be atomic when
  the outer loop runs in parallel.
* Semantics of math ops are torch's on the operand dtype (see each ``ref``); notable:
  ``truediv`` only on floating values, ``floordiv`` = torch.floor_divide (rounds toward -inf),
  ``truncdiv`` = C division (rounds toward 0), ``remainder`` = Python/torch.remainder (sign of
  the divisor), ``fmod`` = C fmod, ``maximum``/``minimum`` propagate NaN, ``round`` = half to
  even, ``to_dtype(x, torch.bool)`` = ``x != 0``, float -> int truncates toward 0.
* Random numbers are counter-based (``kiln_loopir.philox``, Triton's Philox4x32-10): ``ops.rand(
  seed, offset)`` (float32 in [0, 1)), ``ops.randn(seed, offset)`` (float32 standard normal) and
  ``ops.randint64(seed, offset, low, high)`` (int64 in [low, high), ``high - low`` <= 2**31) are
  pure functions of an int64 ``seed`` value and an int64 ``offset`` value of which the low 32
  bits count: recomputing one, in any kernel, gives the same number.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import philox

__all__ = [
    "OpSpec",
    "OPS",
    "REDUCTION_TYPES",
    "WELFORD_TYPES",
    "STORE_MODES",
    "MATH_OPS",
    "INFIX_OPS",
    "op_names",
    "missing_ops",
    "result_dtype",
    "reduction_identity",
]


@dataclass(frozen=True)
class OpSpec:
    name: str
    arity: int  # number of positional arguments (value and non-value) the op takes
    kind: str  # "memory" | "index" | "cast" | "math" | "compare" | "logical" | "bitwise" | "select" | "reduction" | "random"
    dtype_rule: str  # see module docstring
    ref: Callable | None  # reference torch implementation on tensors (None: the interpreter handles it)
    doc: str = ""


def _t(name):
    return getattr(torch, name)


def _sign(x):
    if x.dtype == torch.bool:
        return x
    return torch.sign(x)


def _floordiv(a, b):
    return torch.div(a, b, rounding_mode="floor")


def _truncdiv(a, b):
    return torch.div(a, b, rounding_mode="trunc")


def _reciprocal(x):
    return torch.reciprocal(x)


def _relu_ref(x):
    return torch.relu(x)


def _pow(a, b):
    return torch.pow(a, b)


_SPECS: list[OpSpec] = [
    # --- memory and indexing -------------------------------------------------------------
    OpSpec("load", 2, "memory", "load", None, "load(name: str, index: Expr) -> value"),
    OpSpec("store", 3, "memory", "none", None,
           "store(name: str, index: Expr, value, mode=None); mode None | 'atomic_add'"),
    OpSpec("reduction", 4, "reduction", "arg", None,
           "reduction(dtype, src_dtype, reduction_type: str, value) -> accumulator value"),
    OpSpec("store_reduction", 3, "memory", "none", None,
           "store_reduction(name: str, index: Expr, value): converts to the buffer dtype"),
    OpSpec("index_expr", 2, "index", "arg", None,
           "index_expr(expr: Expr, dtype) -> value of an index expression as dtype (int32/int64)"),
    OpSpec("indirect_indexing", 2, "index", "index", None,
           "indirect_indexing(x, size: Expr, check=True) -> sympy.Symbol ind*; wraps negatives"),
    OpSpec("constant", 2, "index", "arg", None,
           "constant(value: bool|int|float (incl. inf/nan), dtype) -> value"),
    OpSpec("to_dtype", 2, "cast", "arg", lambda x, dtype: x.to(dtype),
           "to_dtype(x, dtype) -> value (torch .to semantics)"),
    OpSpec("where", 3, "select", "where", torch.where, "where(cond: bool, a, b)"),
    # --- unary math ------------------------------------------------------------------------
    OpSpec("abs", 1, "math", "same", torch.abs),
    OpSpec("neg", 1, "math", "same", torch.neg),
    OpSpec("reciprocal", 1, "math", "same", _reciprocal, "floating only"),
    OpSpec("sqrt", 1, "math", "same", torch.sqrt),
    OpSpec("rsqrt", 1, "math", "same", torch.rsqrt),
    OpSpec("exp", 1, "math", "same", torch.exp),
    OpSpec("exp2", 1, "math", "same", torch.exp2),
    OpSpec("expm1", 1, "math", "same", torch.expm1),
    OpSpec("log", 1, "math", "same", torch.log),
    OpSpec("log2", 1, "math", "same", torch.log2),
    OpSpec("log10", 1, "math", "same", torch.log10),
    OpSpec("log1p", 1, "math", "same", torch.log1p),
    OpSpec("sin", 1, "math", "same", torch.sin),
    OpSpec("cos", 1, "math", "same", torch.cos),
    OpSpec("tan", 1, "math", "same", torch.tan),
    OpSpec("asin", 1, "math", "same", torch.asin),
    OpSpec("acos", 1, "math", "same", torch.acos),
    OpSpec("atan", 1, "math", "same", torch.atan),
    OpSpec("sinh", 1, "math", "same", torch.sinh),
    OpSpec("cosh", 1, "math", "same", torch.cosh),
    OpSpec("tanh", 1, "math", "same", torch.tanh),
    OpSpec("asinh", 1, "math", "same", torch.asinh),
    OpSpec("acosh", 1, "math", "same", torch.acosh),
    OpSpec("atanh", 1, "math", "same", torch.atanh),
    OpSpec("sigmoid", 1, "math", "same", torch.sigmoid),
    OpSpec("erf", 1, "math", "same", torch.erf),
    OpSpec("erfc", 1, "math", "same", torch.erfc),
    OpSpec("erfinv", 1, "math", "same", torch.erfinv),
    OpSpec("lgamma", 1, "math", "same", torch.lgamma),
    OpSpec("sign", 1, "math", "same", _sign, "-1/0/1 (NaN -> 0 like torch.sign)"),
    OpSpec("signbit", 1, "math", "bool", torch.signbit),
    OpSpec("floor", 1, "math", "same", torch.floor),
    OpSpec("ceil", 1, "math", "same", torch.ceil),
    OpSpec("round", 1, "math", "same", torch.round, "half to even"),
    OpSpec("trunc", 1, "math", "same", torch.trunc),
    OpSpec("isnan", 1, "math", "bool", torch.isnan),
    OpSpec("isinf", 1, "math", "bool", torch.isinf),
    OpSpec("isfinite", 1, "math", "bool", torch.isfinite),
    OpSpec("relu", 1, "math", "same", _relu_ref, "max(x, 0); NaN stays NaN"),
    # --- binary math -----------------------------------------------------------------------
    OpSpec("add", 2, "math", "same", torch.add),
    OpSpec("sub", 2, "math", "same", torch.sub),
    OpSpec("mul", 2, "math", "same", torch.mul),
    OpSpec("truediv", 2, "math", "same", torch.true_divide, "floating only"),
    OpSpec("floordiv", 2, "math", "same", _floordiv, "torch.floor_divide"),
    OpSpec("truncdiv", 2, "math", "same", _truncdiv, "div(rounding_mode='trunc')"),
    OpSpec("remainder", 2, "math", "same", torch.remainder, "sign of the divisor"),
    OpSpec("fmod", 2, "math", "same", torch.fmod, "sign of the dividend"),
    OpSpec("pow", 2, "math", "same", _pow),
    OpSpec("atan2", 2, "math", "same", torch.atan2),
    OpSpec("hypot", 2, "math", "same", torch.hypot),
    OpSpec("copysign", 2, "math", "same", torch.copysign),
    OpSpec("maximum", 2, "math", "same", torch.maximum, "NaN-propagating"),
    OpSpec("minimum", 2, "math", "same", torch.minimum, "NaN-propagating"),
    # --- comparison ------------------------------------------------------------------------
    OpSpec("eq", 2, "compare", "bool", torch.eq),
    OpSpec("ne", 2, "compare", "bool", torch.ne),
    OpSpec("lt", 2, "compare", "bool", torch.lt),
    OpSpec("le", 2, "compare", "bool", torch.le),
    OpSpec("gt", 2, "compare", "bool", torch.gt),
    OpSpec("ge", 2, "compare", "bool", torch.ge),
    # --- logical (bool operands) -----------------------------------------------------------
    OpSpec("logical_and", 2, "logical", "bool", torch.logical_and),
    OpSpec("logical_or", 2, "logical", "bool", torch.logical_or),
    OpSpec("logical_xor", 2, "logical", "bool", torch.logical_xor),
    OpSpec("logical_not", 1, "logical", "bool", torch.logical_not),
    # --- bitwise (integer or bool operands) -------------------------------------------------
    OpSpec("bitwise_and", 2, "bitwise", "same", torch.bitwise_and),
    OpSpec("bitwise_or", 2, "bitwise", "same", torch.bitwise_or),
    OpSpec("bitwise_xor", 2, "bitwise", "same", torch.bitwise_xor),
    OpSpec("bitwise_not", 1, "bitwise", "same", torch.bitwise_not),
    OpSpec("bitwise_left_shift", 2, "bitwise", "same", torch.bitwise_left_shift),
    OpSpec("bitwise_right_shift", 2, "bitwise", "same", torch.bitwise_right_shift),
    # --- random numbers (counter-based: a pure function of seed and offset) -------------------
    OpSpec("rand", 2, "random", "float32", philox.uniform,
           "rand(seed: int64, offset: int64) -> float32 uniform on [0, 1) (tl.rand)"),
    OpSpec("randn", 2, "random", "float32", philox.normal,
           "randn(seed: int64, offset: int64) -> float32 standard normal (tl.randn)"),
    OpSpec("randint64", 4, "random", "int64", philox.randint64,
           "randint64(seed, offset, low, high: int64) -> int64 uniform on [low, high)"),
]

OPS: dict[str, OpSpec] = {s.name: s for s in _SPECS}

#: names of the pure math/compare/logical/bitwise/select/cast/random ops (those with a ``ref``)
MATH_OPS: frozenset[str] = frozenset(s.name for s in _SPECS if s.ref is not None)

#: binary ops that C-like codegens (C++, Triton) write as one infix operator between their
#: operands, spelled the same in both: ``f"{a} {op} {b}"`` (a codegen may override one for a
#: dtype, as Triton's ``add`` and ``mul`` of bools)
INFIX_OPS: dict[str, str] = {
    "add": "+", "sub": "-", "mul": "*", "truediv": "/",
    "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
    "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^",
}

REDUCTION_TYPES: frozenset[str] = frozenset(
    {"sum", "prod", "max", "min", "argmax", "argmin", "any", "all", "welford_mean", "welford_m2"}
)

#: the one-pass (mean, m2, count) reductions: their state is not one scalar accumulator
WELFORD_TYPES: frozenset[str] = frozenset({"welford_mean", "welford_m2"})

STORE_MODES: frozenset = frozenset({None, "atomic_add"})


#: dtype rules naming the result dtype itself (random ops)
_FIXED_DTYPES = {"float32": torch.float32, "int64": torch.int64}


def op_names() -> list[str]:
    return list(OPS)


def missing_ops(handler) -> list[str]:
    """The op names of the spec that ``handler`` (an object or class) does not define."""
    return [n for n in OPS if not callable(getattr(handler, n, None))]


def result_dtype(name: str, arg_dtypes: list, dtype_arg=None):
    """Result dtype of ``ops.<name>`` given its value operands' dtypes (and its dtype arg)."""
    rule = OPS[name].dtype_rule
    if rule == "same":
        return arg_dtypes[0]
    if rule == "bool":
        return torch.bool
    if rule == "arg":
        return dtype_arg
    if rule == "where":
        return arg_dtypes[1]
    if rule in _FIXED_DTYPES:
        return _FIXED_DTYPES[rule]
    return None


def reduction_identity(reduction_type: str, dtype: torch.dtype):
    """The neutral starting value of an accumulator (Python scalar)."""
    if reduction_type == "sum":
        return False if dtype == torch.bool else 0
    if reduction_type == "prod":
        return True if dtype == torch.bool else 1
    if reduction_type in ("max", "argmax"):
        if dtype == torch.bool:
            return False
        return -math.inf if dtype.is_floating_point else torch.iinfo(dtype).min
    if reduction_type in ("min", "argmin"):
        if dtype == torch.bool:
            return True
        return math.inf if dtype.is_floating_point else torch.iinfo(dtype).max
    if reduction_type == "any":
        return False
    if reduction_type == "all":
        return True
    raise KeyError(reduction_type)
