"""From a torch-level graph to an ``Artifact``: a table of named stages run by one loop.

    fold constants -> trace -> fold weight subgraphs -> lower -> schedule -> codegen
        -> compile kernels -> describe

Each stage is one call into its package, reading and writing named fields of the compile's
state (``Compile``). ``run`` times each stage (``KILN_LOGS=perf``: phase ``<stage>``), writes
its debug dump (``KILN_COMPILE_DEBUG=1``, ``kiln.debug``) and re-raises an unexpected failure
as ``KilnCompileError`` naming the stage. The stack declining a graph (``DECLINED``: aliased
input mutations, graphs loopir cannot lower) passes through for the caller to run it eagerly;
kernels that do not compile are kept as the artifact's reason to run on loopir's interpreter.

Tables: ``KILN`` (the ``kiln`` backend), ``INTERPRET`` (``loopir_interpret``: the same front,
then the interpreter); ``run(KILN, state, first="lower")`` starts from an ATen graph (the
forward and backward graphs of training). The last stage, ``describe``, makes the Artifact
(``kiln.artifact``); ``kiln.assemble`` turns it into a callable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import kiln_aotgrad
import kiln_loopir
import torch
from kiln_loopir import codegen_registry
from kiln_loopir.codegen_protocol import KernelDef
from kiln_loopir.derived_constants import constant_reads
from kiln_loopir.lowerings.random import random_numbers
from kiln_runtime import compile_timer

from . import constants
from .artifact import Artifact, LocalValues, WeightGuards
from .codegens import codegen_for_device, random_policy
from .debug import NO_TRACE, DebugTrace
from .names import GraphNames, graph_names
from .options import Options, body_options
from .passes import fold_conv_batchnorm, fold_weight_subgraphs
from .passes.fold_batchnorm import FoldedParams
from .passes.fold_weight_subgraphs import RECIPES as WEIGHT_FOLD_RECIPES
from .recording import compiling
from .stats import counters
from .wrappers import graph_facts, out_structure

log = logging.getLogger("kiln")

__all__ = ["Compile", "DECLINED", "INTERPRET", "KILN", "KilnCompileError", "Stage",
           "compile_errors", "declined_reason", "lower_and_schedule", "run", "step"]


@dataclasses.dataclass
class Compile:
    """One compile's state: its inputs, then what each stage made."""

    gm: torch.fx.GraphModule  # the graph the backend got (an ATen graph when run from "lower")
    example_inputs: Sequence
    config: Options
    trace: DebugTrace = NO_TRACE
    whole: bool = True  # a whole torch-level graph (False: a piece of a training graph)
    folded_gm: Any = None  # fold constants
    folded: FoldedParams = dataclasses.field(default_factory=FoldedParams)
    aten_gm: Any = None  # trace
    graph: Any = None  # lower: kiln_loopir.LoopGraph
    schedule: Any = None  # schedule: kiln_loopir.Schedule
    module: Any = None  # codegen: kiln_loopir.GeneratedModule
    namespace: dict | None = None  # compile kernels: the loaded kernels
    kernel_error: BaseException | None = None
    interpret: str | None = None  # why the graph runs on loopir's interpreter
    unstorable: str | None = None  # why the cache must not keep it (``kiln.recording``)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    artifact: Artifact | None = None  # describe


@dataclasses.dataclass(frozen=True)
class Stage:
    """A named step: ``run(state)``; ``calls``: what it calls (error messages); ``dump``:
    ``(file, field)`` written to the debug folder after it, or a function of the state."""

    name: str
    calls: str
    run: Callable[[Compile], None]
    dump: tuple[str, str] | Callable[[Compile], None] | None = None

    def write_dump(self, c: Compile) -> None:
        if not c.trace or self.dump is None:
            return
        if callable(self.dump):
            self.dump(c)
        else:
            c.trace.write(self.dump[0], getattr(c, self.dump[1]))


# ----------------------------------------------------------------------------- the stages


def fold_constants(c: Compile) -> None:
    """Eval-mode BatchNorms folded into their convs' weights (guarded by their sources)."""
    c.folded_gm, c.folded = fold_conv_batchnorm(c.gm, c.example_inputs)


def trace(c: Compile) -> None:
    """aotgrad's inference trace; its rules that depend on the codegen (a fused FlexAttention
    kernel, ``kiln.higher_order``) read this compile's Options."""
    with body_options(c.config):
        c.aten_gm = kiln_aotgrad.trace_inference(c.folded_gm, c.example_inputs)


def fold_weights(c: Compile) -> None:
    """Weight-only subgraphs of the ATen graph computed once (``kiln.passes``); their
    sources are guarded with the BatchNorm fold's."""
    info = getattr(c.aten_gm, "meta", {}).get("kiln")
    made = set(getattr(info, "trace_constants", ()))
    weights = {n.target for n in c.aten_gm.graph.nodes
               if n.op == "get_attr" and n.target not in made}
    guard = fold_weight_subgraphs(c.aten_gm, weights)
    c.folded.sources.extend(guard.sources)


def lower(c: Compile) -> None:
    """loopir's lowering; higher-order operators' bodies it meets compile with this compile's
    Options (``kiln.options.body_options``)."""
    with random_numbers(random_policy(c.config)), body_options(c.config):
        c.graph = kiln_loopir.lower(c.aten_gm)


def schedule(c: Compile) -> None:
    c.schedule = kiln_loopir.schedule(c.graph)


def codegen(c: Compile) -> None:
    generator = codegen_for_device(c.schedule.graph.device, c.config)  # cpp on CPU, triton on CUDA
    c.module = kiln_loopir.generate_wrapper(c.schedule, generator)


def compile_kernels(c: Compile) -> None:
    """The codegen compiles and loads its kernels (C++: a shared library; Triton: launchers
    that compile at first launch). A kernel that does not compile is kept as the reason to
    run on loopir's interpreter (assemble warns once)."""
    try:
        c.namespace = c.module.namespace_builder() if c.module.namespace_builder else {}
    except compile_errors() as e:
        c.kernel_error = e
        c.interpret = f"a generated kernel did not compile ({type(e).__name__})"


def interpret(c: Compile) -> None:
    c.interpret = "the loopir_interpret backend"


def describe(c: Compile) -> None:
    """The Artifact: generated code, where each constant comes from, the weights to guard,
    the output structure and the facts CUDA graphs need."""
    names = graph_names(c.gm)
    module = c.module
    values = dict(module.constants) if module is not None else {}
    local = LocalValues(constants=values, namespace=c.namespace, kernel_error=c.kernel_error,
                        state=c)
    artifact = Artifact(
        codegen=getattr(module, "codegen", ""),
        entry=getattr(module, "entry", "call"),
        wrapper_source=getattr(module, "wrapper_source", ""),
        kernels=[KernelDef(k.name, k.source, list(k.arg_names), meta=dict(k.meta))
                 for k in getattr(module, "kernels", ())],
        facts=graph_facts(c.aten_gm),
        out_structure=out_structure(c.aten_gm) if "kiln" in getattr(c.aten_gm, "meta", {}) else None,
        interpret=c.interpret,
        stage_seconds=c.seconds,
        local=local,
    )
    if c.kernel_error is not None:
        artifact.unstorable = "its kernels did not compile (interpreter fallback)"
    elif c.interpret is not None:
        artifact.unstorable = "it runs on loopir's interpreter"
    artifact.unstorable = artifact.unstorable or c.unstorable
    info = getattr(c.aten_gm, "meta", {}).get("kiln")
    weight_valued = False
    try:
        # (a plain nn.Module given to the backend has no graph meta and folds nothing)
        recipes = getattr(c.folded_gm, "meta", {}).get("kiln_folded_recipes") or {}
        artifact.constants, weight_valued = constants.describe(
            c.schedule.graph.constant_buffers, values, c.gm, names, recipes,
            frozenset(getattr(info, "trace_constants", ())),
            getattr(c.aten_gm, "meta", {}).get(WEIGHT_FOLD_RECIPES))
    except constants.NoRecipe as e:
        artifact.constants = dict.fromkeys(values)
        artifact.unstorable = artifact.unstorable or str(e)
    if c.whole:
        _guards(c, artifact, names, all_weights=weight_valued)
    c.artifact = artifact


def _guards(c: Compile, artifact: Artifact, names: GraphNames, *, all_weights: bool) -> None:
    """The weights the compiled graph depends on (``WeightGuards``), named: the fold's sources
    and the modules it folded, the sources of copied or packed constants (computed from),
    and the weights constants alias (views). The fold's own tensors are guarded by their
    sources."""
    own = {id(getattr(c.folded_gm, name)) for name in
           ((getattr(c.folded_gm, "meta", {}) or {}).get("kiln_folded_recipes") or ())}
    derived_from, reads = constant_reads(c.schedule.graph, c.aten_gm)
    versions = {id(t): (t, v) for t, v in c.folded.sources}  # the versions folded from
    for t in derived_from:
        if id(t) not in own:
            versions.setdefault(id(t), (t, t._version))
    computed_from = [t for t, _ in versions.values()]
    views = [t for t in reads if id(t) not in own and id(t) not in versions]
    known = names.name_live_objects(c.gm)
    named = [[known[id(o)] for o in objs if id(o) in known]
             for objs in (computed_from, views, c.folded.eval_modules)]
    unnamed = tuple([o for o in objs if id(o) not in known]
                    for objs in (computed_from, views, c.folded.eval_modules))
    artifact.guards = WeightGuards(*map(tuple, named), all_weights=all_weights)
    artifact.local.version_sum = sum(v for _, v in versions.values())
    artifact.local.unnamed_guards = unnamed  # not the module's: a hit stores their constants


def _output_code(c: Compile) -> None:
    c.trace.write_output_code(c.module)


#: the ``kiln`` backend's stages
KILN: tuple[Stage, ...] = (
    Stage("fold constants", "kiln.passes.fold_conv_batchnorm", fold_constants),
    Stage("trace", "kiln_aotgrad.trace_inference", trace, ("aten_graph.txt", "aten_gm")),
    Stage("fold weight subgraphs", "kiln.passes.fold_weight_subgraphs", fold_weights),
    Stage("lower", "kiln_loopir.lower", lower, ("ir_pre_fusion.txt", "graph")),
    Stage("schedule", "kiln_loopir.schedule", schedule, ("ir_post_fusion.txt", "schedule")),
    Stage("codegen", "kiln_loopir.generate_wrapper", codegen, _output_code),
    Stage("compile kernels", "the codegen's finalize", compile_kernels),
    Stage("describe", "kiln.stages.describe", describe),
)
#: the ``loopir_interpret`` backend's: the same front, then loopir's interpreter
INTERPRET: tuple[Stage, ...] = (*KILN[:5], Stage("interpret", "kiln_loopir.interpret", interpret),
                                KILN[-1])
#: what a hit runs again when it needs the ATen graph or the schedule (profiling, the
#: interpreter fallback)
FRONT: tuple[Stage, ...] = KILN[:5]


def run(table: Sequence[Stage], c: Compile, *, first: str | None = None,
        until: str | None = None) -> Compile:
    """Run ``table``'s stages on ``c`` (from ``first``, through ``until``), each timed,
    dumped and named in its errors. Starting past the first stage, the IR it starts from is
    dumped as the stage that makes it would have."""
    names = [s.name for s in table]
    start = names.index(first) if first else 0
    stop = names.index(until) + 1 if until else len(table)
    if start > 0:
        table[start - 1].write_dump(c)
    for stage in table[start:stop]:
        t0 = time.perf_counter()
        with step(stage.name, stage.calls), compiling(c):
            stage.run(c)
        c.seconds[stage.name] = time.perf_counter() - t0
        stage.write_dump(c)
    return c


def lower_and_schedule(aten_gm: torch.fx.GraphModule, trace: DebugTrace = NO_TRACE,
                       config: Options | None = None):
    """loopir's two stages on an ATen graph, with their debug files: the Schedule."""
    c = Compile(aten_gm, (), config or Options(), trace, aten_gm=aten_gm)
    return run(KILN, c, first="lower", until="schedule").schedule


# ------------------------------------------------------------------------------- failures


class KilnCompileError(RuntimeError):
    """A stage of kiln's pipeline failed on a graph (a bug in kiln: please report it with the
    debug folder, ``KILN_COMPILE_DEBUG=1``). ``.step`` names the stage; the original error is
    chained as ``__cause__``."""

    def __init__(self, step: str, error: BaseException):
        self.step = step
        super().__init__(
            f"kiln's {step} step failed: {type(error).__name__}: {error} "
            "(KILN_COMPILE_DEBUG=1 writes this graph's debug folder)"
        )


#: errors that mean "the stack declines this graph" (the caller runs it eagerly)
DECLINED = (
    kiln_aotgrad.AliasedInputMutationError,
    kiln_aotgrad.MutatedGradInputError,
    kiln_loopir.LoweringError,
)


def declined_reason(e: BaseException) -> str:
    if isinstance(e, kiln_loopir.LoweringError):  # mutates a non-input, symbolic floats, ...
        return f"loopir cannot lower this graph: {e}"
    return str(e)


def compile_errors() -> tuple[type[BaseException], ...]:
    """The registered codegens' "kernel did not compile" errors."""
    return codegen_registry.compile_errors()


@contextlib.contextmanager
def step(name: str, calls: str) -> Iterator[None]:
    """Time the block as phase ``name``; re-raise an unexpected failure as
    ``KilnCompileError`` naming it (counted as ``compile_failure:<name>``). Declined graphs
    and kernel compile errors pass through unchanged."""
    try:
        with compile_timer.phase(name):
            yield
    except (*DECLINED, *compile_errors(), KilnCompileError):
        raise
    except Exception as e:
        counters[f"compile_failure:{name}"] += 1
        raise KilnCompileError(f"{name} ({calls})", e) from e
