"""The CPU pipeline: FX graph -> aotgrad -> loopir -> C++ kernels + wrapper -> runtime."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import kiln_aotgrad
import kiln_loopir
import kiln_runtime
import torch
from kiln_runtime.guards import WeightsGuard

from .codegen import CppCodegen
from .compiler import CppCompileError


class KilnFallbackWarning(RuntimeWarning):
    """A graph's C++ kernels did not compile; it runs on the loopir interpreter instead."""


def compile_fx(gm: torch.fx.GraphModule, example_inputs: list, config: Any = None) -> Callable:
    """Compile a torch-level FX graph for CPU: ``compiled(*inputs) -> list[Tensor]``."""
    return compile_aten(kiln_aotgrad.trace_inference(gm, example_inputs), config)


def compile_aten(aten_gm: torch.fx.GraphModule, config: Any = None) -> Callable:
    """Compile an ATen-level FX graph (what aotgrad produces) to C++ kernels; constants
    computed from weights are guarded (``kiln_loopir.compile_guarded``)."""
    return kiln_loopir.compile_guarded(aten_gm, lambda sched: compile_schedule(sched, config),
                                       WeightsGuard.around)


def compile_schedule(schedule, config: Any = None) -> Callable:
    """Generate, compile and load a schedule's C++ kernels and wrapper. If the C++ compiler
    fails, warn once (naming the kernel source) and run the graph on the loopir interpreter."""
    codegen = CppCodegen(num_threads=_option(config, "num_threads"))
    module = kiln_loopir.generate_wrapper(schedule, codegen)
    try:
        compiled = kiln_runtime.load(module, config)
    except CppCompileError as e:
        warnings.warn(
            f"kiln: C++ compilation failed for kernel {e.kernel_name} (source: {e.source_path}); "
            f"this graph runs on the loopir interpreter instead.\n{e.stderr.strip()[:2000]}",
            KilnFallbackWarning,
            stacklevel=2,
        )
        kiln_runtime.counters["cpp_fallbacks"] += 1
        fallback = kiln_loopir.interpret(schedule)
        fallback.module = module
        return fallback
    compiled.module = module
    return compiled


def _option(config: Any, name: str, default=None):
    if config is None:
        return default
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)
