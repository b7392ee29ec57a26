"""Backends for debugging the stack a piece at a time.

``aot_eager``: aotgrad's graphs (inference, or forward and backward) run with torch ops, no
loopir and no codegen: it separates tracing and partitioning bugs from code generation bugs.

``compile_inference(gm, example_inputs, config, back_half=...)``: the ``kiln`` backend's
front stages (fold constants, trace), then a back half of your own,
``back_half(aten_gm, config, trace=...) -> callable`` (tests compare one back half with
another on the same ATen graphs). The ``kiln`` backend itself ends in ``kiln.assemble``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import kiln_aotgrad
import torch
from kiln_runtime.guards import WeightsGuard

from . import stages
from .debug import NO_TRACE, DebugTrace
from .options import Options
from .training import compile_training
from .wrappers import inference_only, needs_autograd, run_eagerly, with_output_structure

__all__ = ["aot_eager_backend", "compile_inference", "with_output_structure"]


def compile_inference(gm: torch.fx.GraphModule, example_inputs: Sequence, config: Options, *,
                      back_half: Callable) -> Callable:
    """Fold constants and trace (the kiln stages), then ``back_half``; the fold's sources
    guarded (a change compiles again), the grad-mode guard around it. A graph that needs
    autograd is compiled for training, each forward and backward graph by ``back_half``."""
    c = stages.Compile(gm, example_inputs, config, DebugTrace.for_compile(config))
    c.trace.write("fx_graph.txt", gm)
    try:
        if needs_autograd(gm, example_inputs):
            return compile_training(
                gm, example_inputs, config, back_half=back_half, trace=c.trace,
                compile_piece=functools.partial(compile_inference, config=config,
                                                back_half=back_half))
        stages.run(stages.KILN, c, until="trace")
        compiled = back_half(c.aten_gm, config, trace=c.trace)
    except stages.DECLINED as e:
        return run_eagerly(gm, stages.declined_reason(e))
    compiled = WeightsGuard.around(
        compiled, lambda: compile_inference(gm, example_inputs, config, back_half=back_half),
        [t for t, _ in c.folded.sources], c.folded.eval_modules,
        version_sum=sum(v for _, v in c.folded.sources))
    return inference_only(gm, compiled)


def _run_aten_eagerly(graph: torch.fx.GraphModule, config: Options, *, trace=NO_TRACE):
    trace.write("aten_graph.txt", graph)
    return graph.forward


def aot_eager_backend(gm: torch.fx.GraphModule, example_inputs: Sequence, options=None):
    """The ``aot_eager`` backend: aotgrad's graphs (inference, or forward and backward) run
    with torch ops, no loopir and no codegen."""
    config = Options.from_user(options)
    from .subclasses import compile_subclass_graph, has_subclasses

    if has_subclasses(gm, example_inputs):  # tensor subclasses: a plain graph inside
        return compile_subclass_graph(
            gm, example_inputs, lambda g, xs: aot_eager_backend(g, xs, options))
    trace = DebugTrace.for_compile(config)
    trace.write("fx_graph.txt", gm)
    try:
        if needs_autograd(gm, example_inputs):
            return compile_training(
                gm, example_inputs, config, back_half=_run_aten_eagerly, trace=trace,
                compile_piece=functools.partial(compile_inference, config=config,
                                                back_half=_run_aten_eagerly),
            )
        aten_gm = kiln_aotgrad.trace_inference(gm, example_inputs)
    except (kiln_aotgrad.AliasedInputMutationError, kiln_aotgrad.MutatedGradInputError) as e:
        return run_eagerly(gm, str(e))
    trace.write("aten_graph.txt", aten_gm)
    return with_output_structure(aten_gm, aten_gm.forward)
