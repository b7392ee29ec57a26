"""``assemble``: the only way from an ``Artifact`` to a callable. A fresh compile and a graph
cache hit both end here (as Triton's compiler ends a hit and a miss in one constructor).

    eager decision? -> the graph's own forward
    constants (the compile's values, or the recipes run again on the live module)
    -> load (kernels + wrapper, kiln_runtime.load; or loopir's interpreter)
    -> profiling (KILN_LOGS=perf) -> first-launch fallback -> CUDA graphs (per mode)
    -> output structure -> grad-mode guard -> weight guards

What a hit lacks it derives: constants from their recipes, kernels from the kernel cache,
and, only when asked for (the interpreter fallback, the profiler's eager comparison), the ATen
graph and schedule by running the front stages again.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Sequence

import kiln_loopir
import kiln_runtime
import torch
from kiln_loopir.codegen_protocol import GeneratedModule
from kiln_runtime.guards import WeightsGuard
from kiln_runtime.logs import log_enabled
from kiln_runtime.profile import PERF_CHANNEL, profiled

from . import constants, stages
from .artifact import Artifact
from .codegens import codegen_by_name, synchronize_of
from .names import GraphNames, graph_names
from .options import Options
from .reduce_overhead import for_mode
from .stats import counters
from .wrappers import inference_only, run_eagerly, structure_restorer

log = logging.getLogger("kiln")

__all__ = ["Binding", "assemble"]


@dataclasses.dataclass
class Binding:
    """The live objects an Artifact is assembled against: the graph the backend got (its
    module's weights), its example inputs and options, and how to compile again when a
    guarded weight changes (``None``: no weight guard, as for the pieces of a training
    graph, which also get no grad-mode guard)."""

    gm: torch.fx.GraphModule
    example_inputs: Sequence
    config: Options
    recompile: Callable[[], Callable] | None = None
    names: GraphNames | None = None

    _state: stages.Compile | None = dataclasses.field(default=None, repr=False)

    def state(self, artifact: Artifact) -> stages.Compile:
        """The compile's state (ATen graph, schedule): the fresh compile's, or, for a hit,
        the front stages run again (once)."""
        if artifact.local is not None and artifact.local.state is not None:
            return artifact.local.state
        if self._state is None:
            c = stages.Compile(self.gm, self.example_inputs, self.config)
            self._state = stages.run(stages.FRONT, c)
        return self._state


def assemble(artifact: Artifact, binding: Binding) -> Callable:
    """A callable with the torch-level graph's signature and outputs running ``artifact``."""
    if artifact.eager_reason is not None:
        return run_eagerly(binding.gm, artifact.eager_reason)
    names = binding.names or graph_names(binding.gm)
    flat = _load(artifact, binding, names)
    flat = profiled(flat, _aten_graph_if_profiling(artifact, binding))  # time each kernel
    flat = _interpret_if_first_launch_fails(flat, lambda e: _interpreter(artifact, binding, e))
    flat = for_mode(flat, artifact.facts, binding.config)  # CUDA graphs per mode
    fn = _with_structure(flat, artifact.out_structure)
    if binding.recompile is None:  # a piece of a training graph
        return fn
    fn = inference_only(binding.gm, fn)
    return _guard_weights(fn, artifact, binding, names)


def _load(artifact: Artifact, binding: Binding, names: GraphNames) -> Callable:
    """The flat callable (``f(*inputs) -> list``): the wrapper with its kernels and
    constants, or loopir's interpreter when the artifact says so."""
    if artifact.interpret is not None:
        error = artifact.local.kernel_error if artifact.local else None
        return _interpreter(artifact, binding, error)
    local = artifact.local
    values = local.constants if local is not None else constants.bind(
        artifact.constants, binding.gm, names)
    namespace = local.namespace if local is not None else None
    kernels = artifact.kernels
    if namespace is None:
        generator = codegen_by_name(artifact.codegen, binding.config)
        def build() -> dict:
            return generator.finalize(kernels)
    else:
        def build() -> dict:
            return namespace
    module = GeneratedModule(wrapper_source=artifact.wrapper_source, kernels=kernels,
                             namespace_builder=build, constants=values,
                             codegen=artifact.codegen, entry=artifact.entry,
                             synchronize=synchronize_of(artifact.codegen))
    try:
        compiled = kiln_runtime.load(module, binding.config)
    except stages.compile_errors() as e:  # e.g. g++ failed: run the IR on the interpreter
        return _interpreter(artifact, binding, e)
    counters["graphs_compiled"] += 1
    counters["kernels_generated"] += len(kernels)
    return compiled


def _interpreter(artifact: Artifact, binding: Binding, error: BaseException | None) -> Callable:
    """loopir's interpreter on the graph's schedule: the ``loopir_interpret`` backend, or
    the fallback when a kernel does not compile."""
    schedule = binding.state(artifact).schedule
    if error is None:
        counters["graphs_interpreted"] += 1
        return kiln_loopir.interpret(schedule)
    return interpret_instead(schedule, error)


def interpret_instead(schedule, error: BaseException) -> Callable:
    """The interpreter for a graph whose kernel did not compile (one warning, counted)."""
    where = getattr(error, "source_path", None)
    log.warning(
        "kiln: a generated kernel did not compile%s; this graph runs on the loopir "
        "interpreter instead: %s",
        f" (source: {where})" if where else "",
        str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__,
    )
    counters["interpreter_fallbacks"] += 1
    return kiln_loopir.interpret(schedule)


def _aten_graph_if_profiling(artifact: Artifact, binding: Binding):
    """The ATen graph the profiler runs eagerly beside the kernels, only when it profiles."""
    if not log_enabled(PERF_CHANNEL) or artifact.interpret is not None:
        return None
    return binding.state(artifact).aten_gm


def _interpret_if_first_launch_fails(compiled, interpreter: Callable) -> Callable:
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
        except stages.compile_errors() as e:
            interpreted = interpreter(e)
            compiled.call = lambda a: interpreted(*a)
            return interpreted(*inputs)
        compiled.call = wrapper_call
        return out

    compiled.call = first_call
    return compiled


def _with_structure(flat: Callable, structure) -> Callable:
    """The torch-level output structure around the flat outputs (``.flat``: the inside)."""
    if structure is None:
        return flat
    restore = structure_restorer(structure)

    def compiled_graph(*args):
        return restore(flat(*args))

    compiled_graph.flat = flat
    return compiled_graph


def _guard_weights(fn: Callable, artifact: Artifact, binding: Binding, names: GraphNames) -> Callable:
    """``fn`` behind a ``WeightsGuard`` over the artifact's guarded weights, resolved in the
    live module; a change compiles again (``binding.recompile``)."""
    gm, guards, local = binding.gm, artifact.guards, artifact.local
    unnamed = local.unnamed_guards if local is not None else ([], [], [])
    tensors = [names.resolve(gm, n) for n in guards.computed_from] + unnamed[0]
    views = [names.resolve(gm, n) for n in guards.views] + unnamed[1]
    modules = [names.resolve(gm, n) for n in guards.modules] + unnamed[2]
    version_sum = local.version_sum if local is not None else None
    if guards.all_weights:  # a stored constant may hold weight values: every weight
        seen = {id(t) for t in tensors}
        tensors += [t for t in itertools.chain(gm.parameters(), gm.buffers())
                    if id(t) not in seen and not seen.add(id(t))]
        modules = list(gm.modules())
        version_sum = None  # the versions now: the compile has just read them
    return WeightsGuard.around(fn, binding.recompile, tensors, modules,
                               version_sum=version_sum, views=views)

