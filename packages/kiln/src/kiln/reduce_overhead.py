"""``mode="reduce-overhead"``: the kiln backend's hook into ``kiln_runtime.cudagraphs``.

``for_mode(compiled, facts, config)`` returns ``compiled`` untouched unless the mode asks for
CUDA graphs; then it returns a ``CudaGraphRunner`` around it (``.compiled``; it calls the
generated wrapper's entry directly), told what the compiled graph's facts
(``kiln.wrappers.graph_facts``) say: a graph that touches the CPU or has data-dependent shapes is
not recorded (the runner logs why), mutated inputs are copied back after each replay, and a
graph compiled with symbolic sizes may pad dim 0 to ``kiln_runtime.cudagraphs.config.buckets``.
"""

from __future__ import annotations

from collections.abc import Callable

from .options import Options
from .wrappers import graph_facts

__all__ = ["CUDAGRAPH_MODES", "for_mode"]

#: torch.compile's modes that record CUDA graphs
CUDAGRAPH_MODES = ("reduce-overhead",)


def skip_reason(facts: dict) -> str | None:
    """Why a compiled graph with these facts is not recorded, or None."""
    devices = facts.get("devices", [])
    if any(not d.startswith("cuda") for d in devices):
        return "CPU tensors: the graph computes on " + ", ".join(sorted(set(devices)))
    if facts.get("data_dependent"):
        return "data-dependent shapes: an output size depends on tensor values"
    return None


def for_mode(compiled: Callable, facts, config: Options) -> Callable:
    """``compiled(*inputs) -> list`` wrapped in CUDA graphs when ``config.mode`` asks for them.
    ``facts``: the graph's facts (a dict) or its ATen graph (facts computed from it)."""
    if config.mode not in CUDAGRAPH_MODES:
        return compiled
    from kiln_runtime import CompiledGraph
    from kiln_runtime.cudagraphs import CudaGraphRunner

    if not isinstance(facts, dict):
        facts = graph_facts(facts)
    runner = CudaGraphRunner(
        # the generated wrapper's own entry (it takes a list) when there is one: a layer less
        compiled.call if isinstance(compiled, CompiledGraph) else lambda args: compiled(*args),
        name=getattr(compiled, "filename", None) or "kiln graph",
        mutated_inputs=facts.get("mutated_inputs", ()),
        bucketed=bool(facts.get("symbolic")),
        skip_reason=skip_reason(facts),
    )
    runner.compiled = compiled  # what it records (the callers' wrappers follow ``.compiled``)
    return runner
