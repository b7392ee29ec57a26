"""The one path from a torch-level graph to a callable (docs/architecture.md, "From graph to
callable"):

    key (kiln.cache) -> hit: the stored Artifact | miss: the stages (kiln.stages) -> Artifact
        -> assemble (kiln.assemble) -> callable

Graphs needing autograd take the training path (``kiln.training``: each of the forward and
backward graphs through the stages from ``lower`` and assemble); graphs over tensor subclasses
compile the plain graph inside them (``kiln.subclasses``). A graph the stack declines runs
eagerly with one log line on logger ``kiln``; any other failure raises ``KilnCompileError``
naming the stage that failed.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence

import torch
from kiln_runtime import compile_timer

from . import cache, stages
from .artifact import Artifact
from .assemble import Binding, assemble
from .debug import NO_TRACE, DebugTrace
from .options import Options
from .subclasses import compile_subclass_graph, has_subclasses
from .training import compile_training
from .wrappers import needs_autograd, non_strided_tensors, run_eagerly

_graph_ids = itertools.count()


def compile_graph(gm, example_inputs: Sequence, config: Options, table=stages.KILN) -> Callable:
    """One torch-level graph: a cache hit or the stages, then assemble."""
    if has_subclasses(gm, example_inputs):  # tensor subclasses: a plain graph inside
        return compile_subclass_graph(
            gm, example_inputs, lambda g, xs: compile_graph(g, xs, config, table))
    declined = non_strided_tensors(gm, example_inputs)
    if declined or needs_autograd(gm, example_inputs):
        return run_eagerly(gm, declined) if declined else _training(gm, example_inputs, config, table)
    with compile_timer.graph(f"graph {next(_graph_ids)} ({getattr(gm, 'meta', {}).get('kiln_code_name', 'fx graph')})"):
        compile_timer.add("capture", float(getattr(gm, "meta", {}).get("kiln_capture_s", 0.0)))
        key, hit = _lookup(gm, example_inputs, config) if table is stages.KILN else (None, None)
        binding = Binding(gm, example_inputs, config, names=key.names if key else None,
                          recompile=lambda: compile_graph(gm, example_inputs, config, table))
        if hit is not None:
            try:
                compiled = assemble(hit, binding)
                compile_timer.note("graph cache hit")
                return compiled
            except Exception as e:  # its weights or kernels no longer fit: compile again
                cache.discard(key, e)
        artifact = _run_stages(table, stages.Compile(gm, example_inputs, config,
                                                     DebugTrace.for_compile(config)))
        if key:
            with compile_timer.phase("cache store"):
                cache.put(key, artifact)
        return assemble(artifact, binding)


def compile_aten(aten_gm: torch.fx.GraphModule, config: Options | None = None, *,
                 trace: DebugTrace = NO_TRACE, table=stages.KILN) -> Callable:
    """An ATen graph (from kiln_aotgrad: a forward or backward graph) -> the stages from
    ``lower`` -> assemble: a callable returning the graph's outputs (no weight guard)."""
    config = Options.from_user(config)
    c = stages.Compile(aten_gm, (), config, trace, whole=False, aten_gm=aten_gm)
    artifact = stages.run(table, c, first="lower").artifact
    return assemble(artifact, Binding(aten_gm, (), config))


def _lookup(gm, example_inputs: Sequence, config: Options):
    with compile_timer.phase("cache lookup"):
        key = cache.key(gm, example_inputs, config)
        return key, cache.get(key) if key else None


def _run_stages(table, c: stages.Compile) -> Artifact:
    c.trace.write("fx_graph.txt", c.gm)
    try:
        return stages.run(table, c).artifact
    except stages.DECLINED as e:
        return Artifact.eager(stages.declined_reason(e))


def _training(gm, example_inputs: Sequence, config: Options, table) -> Callable:
    trace = DebugTrace.for_compile(config)
    trace.write("fx_graph.txt", gm)
    try:
        with stages.step("training", "kiln_aotgrad.compile_joint"):
            return compile_training(gm, example_inputs, config, trace=trace,
                                    back_half=functools.partial(compile_aten, table=table),
                                    compile_piece=lambda g, xs: compile_graph(g, xs, config, table))
    except stages.DECLINED as e:
        return run_eagerly(gm, stages.declined_reason(e))
