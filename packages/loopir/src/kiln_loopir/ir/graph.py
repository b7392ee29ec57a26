"""The lowered graph of the loop IR: ``LoopGraph``, what ``lower`` produces from an ATen FX
graph (the second phase of ``kiln_loopir.ir``, above ``values``):

* ``inputs``: ``InputBuffer`` per tensor placeholder (``position`` = placeholder position);
* ``buffers``: in topological order, each a ``ComputedBuffer`` (a ``Pointwise`` or
  ``Reduction`` loop nest writing one buffer) or an ``ExternKernel`` (an aten op called as is:
  matmul, conv, ..., and the fallback for ops without a lowering; a multi-output extern has
  ``MultiOutput`` buffers selecting its results);
* ``outputs``: per graph output a ``ReinterpretView`` (buffer name + size/stride/offset) or a
  Python scalar;
* ``sizevars``: ``{s-symbol: SizeVarSource}`` (read ``inputs[pos].size(dim)`` at run time);
* ``constants``: ``{name: tensor}`` for ``ConstantBuffer``s (get_attr tensors).

``print(graph)`` gives the text form documented in docs/ir.md (``printer.graph_text``);
``verify.verify_graph`` checks it.
"""

from __future__ import annotations

import itertools
from typing import Any

import sympy
import torch

from ..analysis import MemoryDep, body_deps
from ..sizevars import SizeVarSource
from .printer import graph_text
from .values import (
    Buffer,
    ComputedBuffer,
    ConstantBuffer,
    InputBuffer,
    ReinterpretView,
    body_indices,
)


class LoopGraph:
    """The lowered graph (see the module docstring)."""

    def __init__(self, device: torch.device | None = None):
        self.inputs: list[InputBuffer] = []
        self.input_positions: list[int | None] = []  # placeholder position -> index in inputs
        self.num_placeholders = 0
        self.buffers: list[Buffer] = []
        self.outputs: list[Any] = []
        self.sizevars: dict[sympy.Symbol, SizeVarSource] = {}
        self.constants: dict[str, torch.Tensor] = {}
        self.constant_buffers: list[ConstantBuffer] = []
        self.guards: list[sympy.Basic] = []
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.name_to_buffer: dict[str, Buffer] = {}
        self._counter = itertools.count()
        self.size_hints: dict[sympy.Symbol, int] = {}  # example value of each size symbol
        self.meta: dict[str, Any] = {}

    # ---- building --------------------------------------------------------------------------
    def new_name(self) -> str:
        return f"buf{next(self._counter)}"

    def add_input(self, buf: InputBuffer) -> InputBuffer:
        self.inputs.append(buf)
        self.name_to_buffer[buf.name] = buf
        return buf

    def add_constant(self, buf: ConstantBuffer) -> ConstantBuffer:
        self.constant_buffers.append(buf)
        self.constants[buf.name] = buf.value
        self.name_to_buffer[buf.name] = buf
        return buf

    def register_buffer(self, buf: Buffer) -> Buffer:
        if buf.name in self.name_to_buffer:
            raise ValueError(f"duplicate buffer name {buf.name}")
        self.buffers.append(buf)
        self.name_to_buffer[buf.name] = buf
        return buf

    # ---- reading ---------------------------------------------------------------------------
    def get_buffer(self, name: str) -> Buffer:
        return self.name_to_buffer[name]

    def output_names(self) -> list[str]:
        return [o.data.name for o in self.outputs if isinstance(o, ReinterpretView)]

    def size_symbols(self) -> list[sympy.Symbol]:
        return sorted(self.sizevars, key=lambda s: int(s.name[1:]))

    def __str__(self) -> str:
        return graph_text(self)

    __repr__ = __str__


def collect_deps(buf: ComputedBuffer) -> tuple[list[MemoryDep], list[MemoryDep]]:
    """(reads, writes) of a ComputedBuffer over its own symbols i*/r*."""
    index_lists, var_ranges = body_indices(buf)
    h = body_deps(buf.store_body(), *index_lists, var_ranges=var_ranges)
    return h.reads, h.writes
