"""The Triton pipeline for hand-built FX graphs: FX -> aotgrad -> loopir -> Triton -> runtime."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import kiln_aotgrad
import kiln_loopir
import kiln_runtime
import torch
from kiln_runtime.guards import WeightsGuard

from .codegen import TritonCodegen
from .launcher import TritonCompileError

log = logging.getLogger("kiln")


def compile_aten(aten_gm: torch.fx.GraphModule, config: Any = None) -> Callable:
    """An ATen-level FX graph (what aotgrad produces) with Triton kernels, its weights'
    derived constants guarded (``kiln_loopir.compile_guarded``)."""
    return kiln_loopir.compile_guarded(aten_gm, lambda sched: compile_schedule(sched, config),
                                       WeightsGuard.around)


def compile_fx(gm: torch.fx.GraphModule, example_inputs: list, config: Any = None) -> Callable:
    """Compile a torch-level FX graph with Triton kernels: ``compiled(*inputs) -> list[Tensor]``."""
    return compile_aten(kiln_aotgrad.trace_inference(gm, example_inputs), config)


def compile_schedule(schedule, config: Any = None) -> Callable:
    """Generate and load a schedule's Triton kernels and wrapper; if a kernel does not load,
    log why and run the graph on the loopir interpreter."""
    module = kiln_loopir.generate_wrapper(schedule, TritonCodegen())
    try:
        compiled = kiln_runtime.load(module, config)
    except TritonCompileError as e:
        log.warning("kiln: Triton kernel %s did not compile (%s); running the loopir interpreter",
                    e.kernel_name, e.source_path)
        fallback = kiln_loopir.interpret(schedule)
        fallback.module = module
        return fallback
    compiled.module = module
    return compiled
