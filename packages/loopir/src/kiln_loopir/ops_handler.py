"""The ops-handler base of the codegens that print C-like expressions (C++, Triton).

A codegen's ops handler turns each ``ops.<name>(...)`` call of a loop body into a line of its
language. Most ops are pure math: their text is a *spelling* of the operands' texts, and
their result dtype is the spec's (``ops_spec.result_dtype``). This base owns that path once:

* the calling convention: a spelling is ``fn(*operand_texts, dtype) -> str`` (``dtype``: the
  first operand's dtype, which all operands share: lowering inserted the casts);
* the dispatch: every op named in the class's ``SPELLINGS`` table becomes a method that
  spells its operands (``spell``) and binds the text to a new value of the result dtype
  (``apply_op``); the handler provides the two hooks ``operands`` and ``bind`` (where values
  come from and where lines go: CSE, loop levels, shape classes are the codegen's own);
* the spellings C and Triton share (``ops_spec.INFIX_OPS``' operators, ``neg``) and the
  forms the rest are built from (``call``, ``prefix``, ``infix``, ``float_or``,
  ``float_only``, ``bool_or``, ``unless_bool``);
* the spec check: a handler class must define every op of ``ops_spec.OPS`` (as a spelling
  or as a method: memory, reductions, casts); one that lacks some fails when it is defined,
  naming them (``HandlerSpecError``). A class that is only part of a handler says
  ``partial=True``.

A codegen subclasses it and declares only its own spellings, as data::

    class TritonOps(CLikeOpsHandler, partial=True):
        SPELLINGS = {**CLikeOpsHandler.SPELLINGS, "exp": float_only(call("tl.exp")), ...}

Values are whatever the codegen uses (a C++ variable, a Triton tensor name): the base only
needs ``value.dtype`` and ``str(value)`` (the value's text).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch

from .ops_spec import INFIX_OPS, OPS, missing_ops, result_dtype

__all__ = [
    "CLikeOpsHandler",
    "HandlerSpecError",
    "Spelling",
    "bool_or",
    "call",
    "float_only",
    "float_or",
    "infix",
    "prefix",
    "unless_bool",
]

#: how an op is written: ``fn(*operand_texts, dtype) -> str``
Spelling = Callable[..., str]


class HandlerSpecError(TypeError):
    """A handler class disagrees with ``ops_spec.OPS``: it lacks ops, spells a name the spec
    lacks, or both spells and defines an op."""

    def __init__(self, handler: type, missing: list[str], why: str = "does not implement"):
        self.handler = handler
        self.missing = missing
        super().__init__(f"{handler.__name__} {why} op(s) {', '.join(missing)} of "
                         "kiln_loopir.ops_spec.OPS (spell each in SPELLINGS or define a method)")


# ----------------------------------------------------------------------------- spelling forms


def call(fn: str) -> Spelling:
    """``fn(a, b, ...)``: a function of the target language on every operand."""
    return lambda *xs, dtype: f"{fn}({', '.join(xs)})"


def prefix(op: str) -> Spelling:
    """``<op>x``: a unary operator (``-x``, ``~x``)."""
    return lambda x, dtype: f"{op}{x}"


def infix(op: str) -> Spelling:
    """``a <op> b``: a binary operator between the operands."""
    return lambda a, b, dtype: f"{a} {op} {b}"


def float_or(on_float: Spelling, otherwise: Spelling) -> Spelling:
    """One spelling for floating operands, another for integers and bools."""
    return lambda *xs, dtype: (on_float if dtype.is_floating_point else otherwise)(*xs, dtype=dtype)


def bool_or(on_bool: Spelling, otherwise: Spelling) -> Spelling:
    """One spelling for bool operands (torch's ``add`` of bools is ``or``), another for the rest."""
    return lambda *xs, dtype: (on_bool if dtype == torch.bool else otherwise)(*xs, dtype=dtype)


def _itself(x, dtype) -> str:
    return x


def float_only(spelling: Spelling) -> Spelling:
    """``spelling`` on floating operands; an integer operand is its own result (floor, round)."""
    return float_or(spelling, _itself)


def unless_bool(spelling: Spelling) -> Spelling:
    """``spelling``, except that a bool operand is its own result (abs, sign, relu of a bool)."""
    return bool_or(_itself, spelling)


# ----------------------------------------------------------------------------- the base


def _spelled_op(name: str):
    """The method of a spelled op: spell the operands, bind the text (``apply_op``)."""

    def op(self, *args):
        return self.apply_op(name, args)

    op.__name__ = op.__qualname__ = name
    op.spelled_op = True
    return op


class CLikeOpsHandler:
    """Ops handler of a codegen printing C-like expressions (see the module docstring).

    Subclasses declare ``SPELLINGS`` (``{**Base.SPELLINGS, ...}``: base + differences) and
    implement ``bind`` (and ``operands`` when raw values need converting); the non-math ops
    (``load``, ``store``, ``reduction``, ``to_dtype``, ``where``...) are their methods."""

    #: op name -> spelling, the forms C++ and Triton write alike
    SPELLINGS: ClassVar[dict[str, Spelling]] = {
        **{name: infix(op) for name, op in INFIX_OPS.items()},
        "neg": prefix("-"),
    }

    def __init_subclass__(cls, partial: bool = False, **kwargs):
        super().__init_subclass__(**kwargs)
        unknown = [name for name in cls.SPELLINGS if name not in OPS]
        if unknown:
            raise HandlerSpecError(cls, unknown, why="spells unknown")
        both = [name for name in cls.SPELLINGS
                if callable(getattr(cls, name, None)) and not hasattr(getattr(cls, name), "spelled_op")]
        if both:  # one way to write an op: a spelling or a method, never both
            raise HandlerSpecError(cls, both, why="both spells and defines")
        for name in cls.SPELLINGS:
            if not hasattr(getattr(cls, name, None), "spelled_op"):
                setattr(cls, name, _spelled_op(name))
        if not partial:
            missing = missing_ops(cls)
            if missing:
                raise HandlerSpecError(cls, missing)
            if cls.bind is CLikeOpsHandler.bind:
                raise TypeError(f"{cls.__name__} spells ops but does not bind them (define bind)")

    # --- the dispatch: operands -> spelling -> bound value --------------------------------
    def apply_op(self, name: str, args):
        """``ops.<name>(*args)`` of a spelled op: its text, bound to a value of the spec's
        result dtype."""
        vals = self.operands(name, args)
        dtype = vals[0].dtype
        text = self.spell(name, [str(v) for v in vals], dtype)
        return self.bind(text, result_dtype(name, [v.dtype for v in vals]), vals)

    def spell(self, name: str, texts: list[str], dtype: torch.dtype) -> str:
        """The text of op ``name`` over operand texts of ``dtype``."""
        return self.SPELLINGS[name](*texts, dtype=dtype)

    # --- hooks ---------------------------------------------------------------------------
    def operands(self, name: str, args) -> list:
        """The values an op computes on (a codegen may convert raw Python scalars here)."""
        return list(args)

    def bind(self, text: str, dtype: torch.dtype, operands: list):
        """A value holding ``text`` (a new variable, or an equal one already bound)."""
        raise NotImplementedError(f"{type(self).__name__}.bind")
