"""kiln's bytecode layer for CPython 3.11 to 3.13 (pure Python, no torch).

Public API (documented in docs/bytecode.md):

* :class:`Instruction`, :class:`ExceptionTableEntry`, :func:`decode`,
  :func:`create_instruction` -- the editable instruction form;
* :func:`assemble`, :func:`transform_code`, :class:`BytecodeError` -- back to a CodeType;
* :func:`make_resume_code` -- continuation functions for graph breaks;
* :func:`disassemble` -- dis-like text;
* :mod:`.versions` -- the only module that knows 3.11, 3.12 and 3.13 apart (encodings, stack
  effects, opcode classification), re-exported here as ``versions``;
* :mod:`.builders` -- instruction lists for common operations (``load_global``,
  ``call_function``, ...), in the form ``versions`` names, re-exported as ``builders``.
"""

from . import builders, versions
from .assemble import BytecodeError, assemble, stack_depths, transform_code
from .disasm import disassemble
from .instructions import ExceptionTableEntry, Instruction, Positions, create_instruction, decode
from .resume import make_generator_resume_code, make_reentry_code, make_resume_code
from .versions import (
    is_backward_jump,
    is_conditional_jump,
    is_jump,
    is_raise,
    is_return,
    is_terminator,
    is_unconditional_jump,
    stack_effect,
)

__all__ = [
    "BytecodeError",
    "ExceptionTableEntry",
    "Instruction",
    "Positions",
    "assemble",
    "builders",
    "create_instruction",
    "decode",
    "disassemble",
    "is_backward_jump",
    "is_conditional_jump",
    "is_jump",
    "is_raise",
    "is_return",
    "is_terminator",
    "is_unconditional_jump",
    "make_reentry_code",
    "make_generator_resume_code",
    "make_resume_code",
    "stack_depths",
    "stack_effect",
    "transform_code",
    "versions",
]
