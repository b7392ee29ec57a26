"""kiln's backends, with torch's ``compile(backend=...)`` signature ``(gm, example_inputs,
options=None) -> callable`` (entry points ``kiln.backends``): ``kiln`` (the compiler),
``loopir_interpret`` (the reference) and ``aot_eager`` (``kiln.aot_eager``). Each is a thin
door onto the one path from graph to callable (``kiln.graph_to_callable``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from kiln_loopir.codegen_registry import CodegenUnavailable

from . import stages
from .aot_eager import aot_eager_backend, compile_inference, with_output_structure
from .codegens import codegen_by_name, codegen_for_device, prepare_codegen
from .graph_to_callable import compile_aten, compile_graph
from .options import Options
from .stages import KilnCompileError, lower_and_schedule
from .wrappers import needs_autograd

__all__ = ["kiln_backend", "loopir_interpret_backend", "aot_eager_backend", "compile_aten",
           "compile_graph", "compile_inference", "lower_and_schedule", "with_output_structure",
           "codegen_for_device", "codegen_by_name", "needs_autograd", "CodegenUnavailable",
           "KilnCompileError"]


def kiln_backend(gm: torch.fx.GraphModule, example_inputs: Sequence, options=None) -> Callable:
    """The ``kiln`` backend: ATen graph -> loop IR -> generated kernels -> a callable."""
    config = Options.from_user(options)
    prepare_codegen(gm, example_inputs, config)  # e.g. compile workers start while tracing
    return compile_graph(gm, example_inputs, config, stages.KILN)


def loopir_interpret_backend(gm: torch.fx.GraphModule, example_inputs: Sequence, options=None) -> Callable:
    """The ``loopir_interpret`` backend: the same stages, loopir's reference interpreter
    (torch ops) instead of kernels. Slow; the oracle every codegen is checked against."""
    return compile_graph(gm, example_inputs, Options.from_user(options), stages.INTERPRET)
