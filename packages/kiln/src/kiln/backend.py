"""kiln's backends: ``kiln`` (the compiler), ``loopir_interpret`` (the reference) and
``aot_eager`` (aotgrad's graphs on torch ops, for debugging: it separates tracing and
partitioning bugs from code generation bugs).

Both have the backend signature of torch's ``compile(backend=...)``, ``(gm, example_inputs,
options=None) -> callable``, and are offered to every frontend through the entry-point group
``kiln.backends`` (see pyproject.toml), so ``kiln_frontend.optimize("kiln")`` works, and so does
handing ``kiln.backend.kiln_backend`` to torch's own compile entry point.

The pipeline, one step per package:

    trace (aotgrad) -> lower (loopir) -> schedule (loopir) -> codegen (cpp | triton)
        -> wrapper (loopir.generate_wrapper) -> load (runtime)

The two backends share the front half (``compile_inference``: debug folder, autograd check,
aotgrad trace, eager fallbacks) and differ in the back half: ``compile_aten`` generates code,
``interpret_aten`` runs loopir's interpreter.

A graph whose inputs or parameters require grad takes the training path (``kiln.training``:
aotgrad's joint trace and partition, then each of the forward and backward graphs through the
same back half). A graph the stack declines (it mutates aliased inputs or an input that
requires grad, mutates a value that is not an input, has symbolic floats...) runs eagerly
with one log line on logger ``kiln``.
Any other failure raises ``KilnCompileError`` naming the pipeline step that failed; the
frontend then runs the frame eagerly with one warning (``kiln_frontend.config.suppress_errors``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Sequence

import kiln_aotgrad
import kiln_loopir
import kiln_runtime
import torch
from kiln_loopir import codegen_registry
from kiln_loopir.codegen_registry import CodegenUnavailable
from kiln_loopir.derived_constants import constant_reads
from kiln_loopir.lowerings.random import random_numbers
from kiln_runtime.profile import profiled

from . import cache, reduce_overhead
from .codegens import (
    codegen_by_name,
    codegen_for_device,
    prepare_codegen,
    random_policy,
)
from .debug import NO_TRACE, DebugTrace
from .options import Options
from .passes import fold_conv_batchnorm
from .recording import record_compiled, record_folded
from .stats import counters
from .training import compile_training
from .wrappers import inference_only, needs_autograd, run_eagerly, with_output_structure

log = logging.getLogger("kiln")

__all__ = [
    "kiln_backend",
    "loopir_interpret_backend",
    "aot_eager_backend",
    "compile_inference",
    "compile_aten",
    "interpret_aten",
    "codegen_for_device",
    "codegen_by_name",
    "needs_autograd",
    "CodegenUnavailable",
    "KilnCompileError",
]


def kiln_backend(gm: torch.fx.GraphModule, example_inputs: Sequence, options=None) -> Callable:
    """The ``kiln`` backend: ATen graph -> loop IR -> generated kernels -> a callable."""
    config = Options.from_user(options)
    declined = non_strided_tensors(gm, example_inputs)
    if declined:
        return run_eagerly(gm, declined)

    def build() -> Callable:
        prepare_codegen(gm, example_inputs, config)  # e.g. compile workers start while tracing
        return compile_inference(gm, example_inputs, config, back_half=compile_aten,
                                 recompile=compile_again)

    def compile_again() -> Callable:  # a guarded weight changed: a hit rebinds the live weights
        return cache.compile_cached(gm, example_inputs, config, build)

    return compile_again()  # a hit skips the pipeline


def loopir_interpret_backend(
    gm: torch.fx.GraphModule, example_inputs: Sequence, options=None
) -> Callable:
    """The ``loopir_interpret`` backend: aotgrad -> loopir -> loopir's reference interpreter
    (torch ops). Slow; it is the oracle every codegen is checked against."""
    config = Options.from_user(options)
    declined = non_strided_tensors(gm, example_inputs)
    if declined:
        return run_eagerly(gm, declined)
    return compile_inference(gm, example_inputs, config, back_half=interpret_aten)


def non_strided_tensors(gm: torch.fx.GraphModule, example_inputs: Sequence) -> str | None:
    """Why the graph runs eagerly when an input, parameter or buffer is sparse (or another
    non-strided layout): such tensors have no strides, so they never reach loopir."""
    named = [(f"input {i}", x) for i, x in enumerate(example_inputs)]
    named += [(f"parameter {n}", t) for n, t in gm.named_parameters()]
    named += [(f"buffer {n}", t) for n, t in gm.named_buffers()]
    for name, t in named:
        if isinstance(t, torch.Tensor) and t.layout is not torch.strided:
            return f"{name} is a {str(t.layout).replace('torch.', '')} tensor (only strided tensors compile)"
    return None


def compile_inference(
    gm: torch.fx.GraphModule, example_inputs: Sequence, config: Options, *, back_half: Callable,
    recompile: Callable[[], Callable] | None = None,
) -> Callable:
    """The front half both backends share: debug folder, autograd check, aotgrad trace; then
    ``back_half(aten_gm, config, trace=...)``. Graphs the stack declines run eagerly.

    The result is guarded (``WeightsGuard``) over every module tensor the compiled code reads
    as a constant or computed a constant from: when one has new memory or metadata (``p.data
    = other``, ``p.set_(other)``), or one a constant was computed from was written in place,
    the next call compiles again with ``recompile`` (default: this pipeline again)."""
    if recompile is None:
        def recompile() -> Callable:
            return compile_inference(gm, example_inputs, config, back_half=back_half)
    trace = DebugTrace.for_compile(config)
    trace.write("fx_graph.txt", gm)
    try:
        if needs_autograd(gm, example_inputs):  # training: compiled forward and backward
            with pipeline_step("training (kiln_aotgrad.compile_joint)"):
                return compile_training(
                    gm, example_inputs, config, back_half=back_half, trace=trace,
                    compile_piece=functools.partial(compile_inference, config=config,
                                                    back_half=back_half),
                )
        with pipeline_step("fold batchnorm (kiln.passes.fold_conv_batchnorm)"):
            folded_gm, folded = fold_conv_batchnorm(gm, example_inputs)  # eval BN into conv weights, guarded
            record_folded(getattr(folded_gm, "meta", {}).get("kiln_folded_recipes"))
        with pipeline_step("trace (kiln_aotgrad.trace_inference)"):
            aten_gm = kiln_aotgrad.trace_inference(folded_gm, example_inputs)
        compiled = back_half(aten_gm, config, trace=trace)
        own = {id(getattr(folded_gm, name)) for name in  # the fold's own tensors: guarded
               (getattr(folded_gm, "meta", {}).get("kiln_folded_recipes") or ())}  # by their sources
        folded.guard_copies(t for t in getattr(compiled, "derived_from", ())  # e.g. channels-last
                            if id(t) not in own)  # or packed weights
        compiled = cache.WeightsGuard.around(  # a folded or copied parameter written in place,
            compiled, recompile,  # or one read as a constant given new memory: compile again
            [t for t, _ in folded.sources], folded.eval_modules,
            version_sum=sum(v for _, v in folded.sources),  # the versions folded from
            views=[t for t in getattr(compiled, "reads", ()) if id(t) not in own])
    except (kiln_aotgrad.AliasedInputMutationError, kiln_aotgrad.MutatedGradInputError) as e:
        return run_eagerly(gm, str(e))
    except kiln_loopir.LoweringError as e:  # mutates a non-input, symbolic floats, ...
        return run_eagerly(gm, f"loopir cannot lower this graph: {e}")
    except KilnCompileError as e:  # the frontend runs the frame eagerly: counted, not silent
        counters[f"compile_failure:{e.step.split(' (')[0]}"] += 1
        raise
    return inference_only(gm, compiled)


def compile_aten(
    aten_gm: torch.fx.GraphModule, config: Options | None = None, *, trace: DebugTrace = NO_TRACE
) -> Callable:
    """An ATen graph (from kiln_aotgrad) -> a compiled callable returning gm's outputs."""
    config = Options.from_user(config)
    trace = trace or DebugTrace.for_compile(config)
    schedule = lower_and_schedule(aten_gm, trace, random_policy(config))  # ATen FX -> LoopGraph -> Schedule
    codegen = codegen_for_device(schedule.graph.device, config)  # cpp on CPU, triton on CUDA
    with pipeline_step("codegen (kiln_loopir.generate_wrapper)"):
        module = kiln_loopir.generate_wrapper(schedule, codegen)  # wrapper + kernel sources
    try:
        with pipeline_step("load (kiln_runtime.load)"):
            compiled = kiln_runtime.load(module, config)  # callable(*inputs) -> list of outputs
    except _codegen_compile_errors() as e:  # e.g. g++ failed: run the IR on the interpreter
        compiled = _interpret_instead(schedule, e)
    trace.write_output_code(module, compiled, aten_gm)
    record_compiled(aten_gm, module, compiled)  # what the graph-level cache stores
    compiled = profiled(compiled, aten_gm)  # KILN_LOGS=perf: time each kernel vs eager's ops
    compiled = _interpret_if_first_launch_fails(compiled, schedule)  # Triton compiles lazily
    compiled = reduce_overhead.for_mode(compiled, aten_gm, config)  # CUDA graphs per mode
    counters["graphs_compiled"] += 1
    counters["kernels_generated"] += len(getattr(module, "kernels", ()) or ())
    # the module tensors behind its constants (the caller guards them): computed from
    # (copied, packed: their memory and versions), read in place (their memory)
    derived_from, reads = constant_reads(schedule.graph, aten_gm)
    return with_output_structure(aten_gm, compiled, derived_from=derived_from, reads=reads)


def interpret_aten(
    aten_gm: torch.fx.GraphModule, config: Options | None = None, *, trace: DebugTrace = NO_TRACE
) -> Callable:
    """An ATen graph -> loopir's reference interpreter, returning gm's outputs."""
    schedule = lower_and_schedule(aten_gm, trace)
    interpreted = kiln_loopir.interpret(schedule)
    counters["graphs_interpreted"] += 1
    return with_output_structure(aten_gm, interpreted)


def lower_and_schedule(aten_gm: torch.fx.GraphModule, trace: DebugTrace = NO_TRACE,
                       random: str = "auto"):
    """loopir's two steps, with their debug files: lower (ATen FX -> LoopGraph, SymPy sizes),
    then schedule (fusion, loop order, memory plan). ``random``: how random ops lower
    (``random_policy``)."""
    trace.write("aten_graph.txt", aten_gm)
    with pipeline_step("lower (kiln_loopir.lower)"), random_numbers(random):
        graph = kiln_loopir.lower(aten_gm)
    trace.write("ir_pre_fusion.txt", graph)
    with pipeline_step("schedule (kiln_loopir.schedule)"):
        schedule = kiln_loopir.schedule(graph)
    trace.write("ir_post_fusion.txt", schedule)
    return schedule


class KilnCompileError(RuntimeError):
    """A step of kiln's pipeline failed on a graph (a bug in kiln: please report it with the
    debug folder, ``KILN_COMPILE_DEBUG=1``). ``.step`` names the step; the original error is
    chained as ``__cause__``."""

    def __init__(self, step: str, error: BaseException):
        self.step = step
        super().__init__(
            f"kiln's {step} step failed: {type(error).__name__}: {error} "
            "(KILN_COMPILE_DEBUG=1 writes this graph's debug folder)"
        )


#: errors that mean "the stack declines this graph" (handled: the graph runs eagerly)
_DECLINED = (
    kiln_aotgrad.AliasedInputMutationError,
    kiln_aotgrad.MutatedGradInputError,
    kiln_loopir.LoweringError,
)


@contextlib.contextmanager
def pipeline_step(step: str) -> Iterator[None]:
    """Re-raise an unexpected failure inside ``step`` as ``KilnCompileError`` naming the step
    (declined graphs and kernel compiler errors pass through unchanged)."""
    try:
        with kiln_runtime.compile_timer.phase(step.split(" (")[0]):  # KILN_LOGS=perf
            yield
    except (*_DECLINED, *_codegen_compile_errors(), KilnCompileError):
        raise
    except Exception as e:
        raise KilnCompileError(step, e) from e


# ---------------------------------------------------------------------------------- helpers


def _codegen_compile_errors() -> tuple[type[BaseException], ...]:
    """The registered codegens' "kernel did not compile" errors (for the interpreter fallback)."""
    return codegen_registry.compile_errors()


def _interpret_instead(schedule, error: BaseException) -> Callable:
    where = getattr(error, "source_path", None)
    log.warning(
        "kiln: a generated kernel did not compile%s; this graph runs on the loopir "
        "interpreter instead: %s",
        f" (source: {where})" if where else "",
        str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__,
    )
    counters["interpreter_fallbacks"] += 1
    return kiln_loopir.interpret(schedule)


def _interpret_if_first_launch_fails(compiled, schedule) -> Callable:
    """Triton launchers compile and autotune at a kernel's first launch, inside the graph's
    first call: a kernel that does not compile then must not reach the user as an exception,
    any more than one that fails at load. The first call runs through a check that switches
    the graph to the interpreter (one warning) and runs it there; a first call that succeeds
    puts the wrapper's own ``call`` back, so later calls pay nothing. Safe to run again from
    the start: the graph's writes to its inputs come last (loopir defers them)."""
    if not isinstance(compiled, kiln_runtime.CompiledGraph):
        return compiled
    wrapper_call = compiled.call

    def first_call(args: list) -> list:
        inputs = list(args)  # the wrapper empties its list as it goes
        try:
            out = wrapper_call(args)
        except _codegen_compile_errors() as e:
            interpreted = _interpret_instead(schedule, e)
            compiled.call = lambda a: interpreted(*a)
            return interpreted(*inputs)
        compiled.call = wrapper_call
        return out

    compiled.call = first_call
    return compiled


# ---------------------------------------------------------------------------------- aot_eager


def _run_aten_eagerly(graph: torch.fx.GraphModule, config: Options, *, trace=NO_TRACE):
    trace.write("aten_graph.txt", graph)
    return graph.forward


def aot_eager_backend(gm: torch.fx.GraphModule, example_inputs: Sequence, options=None):
    """The ``aot_eager`` backend: aotgrad's graphs (inference, or forward and backward) run
    with torch ops, no loopir and no codegen."""
    config = Options.from_user(options)
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
