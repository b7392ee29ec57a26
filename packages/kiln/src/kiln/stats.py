"""``kiln.stats()``: what the compiler stack did in this process, in one readable object."""

from __future__ import annotations

import dataclasses
import importlib
from collections import Counter

__all__ = ["Stats", "stats", "reset_stats", "counters"]

#: kiln's own counters: ``graphs_compiled`` (through compile_aten), ``graphs_interpreted``
#: (loopir_interpret backend), ``kernels_generated``, ``eager_fallbacks`` and, per reason,
#: ``eager_fallback:<reason>``.
counters: Counter[str] = Counter()


@dataclasses.dataclass
class Stats:
    """Counters since process start (or ``kiln.reset_stats()``).

    - ``graphs_compiled``: graphs the ``kiln`` backend compiled to generated code;
    - ``graphs_interpreted``: graphs the ``loopir_interpret`` backend prepared;
    - ``kernels_generated``: kernels the codegens defined for those graphs;
    - ``fused_groups``: fused groups the loopir scheduler formed;
    - ``cache_hits`` / ``cache_misses``: kiln_runtime's on-disk artifact cache;
    - ``cpp_compiles``: C++ compiler runs (cache misses that compiled);
    - ``eager_fallbacks``: graphs the backend ran eagerly instead (``fallback_reasons``
      says why: mutated input requiring grad, aliased input mutation, ...);
    - ``interpreter_fallbacks``: graphs whose kernels did not compile, run on loopir's
      interpreter instead;
    - ``compile_failures``: graphs whose compile raised ``KilnCompileError`` (a kiln bug), by
      the pipeline step that failed: the frontend then runs the frame eagerly with a warning
      (or raises, with ``suppress_errors`` off), so a benchmark counts these as eager too;
    - ``aten_fallbacks``: ops loopir ran through the aten fallback, by op name;
    - ``training_graphs``: joint forward+backward graphs traced and partitioned (training);
    - ``forward_graphs_compiled`` / ``backward_graphs_compiled``: their compiled halves;
    - ``saved_bytes``: bytes the partitions save for the backward, summed over them;
    - ``graph_cache_hits`` / ``graph_cache_misses``: the graph-level artifact cache
      (``kiln.cache``; a hit skips the whole pipeline; ``graph_cache_stale``: entries found
      unusable and rebuilt); ``kernel_cache_hits`` / ``kernel_cache_misses``: kernel binaries
      (kinds other than ``graph`` in kiln_runtime's disk cache); ``cache_corrupt``: entries
      that failed their manifest and were rebuilt;
    - ``cudagraphs_recorded``: CUDA graphs recorded (``mode="reduce-overhead"``);
      ``cudagraph_memory``: bytes of device memory per recorded graph (outputs + static
      inputs + pool growth), by ``runner signature slot``; ``cudagraph_skips``: why graphs
      were not recorded or a call ran without one, by reason.
    """

    graphs_compiled: int = 0
    graphs_interpreted: int = 0
    kernels_generated: int = 0
    fused_groups: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cpp_compiles: int = 0
    eager_fallbacks: int = 0
    interpreter_fallbacks: int = 0
    compile_failures: dict[str, int] = dataclasses.field(default_factory=dict)
    fallback_reasons: dict[str, int] = dataclasses.field(default_factory=dict)
    aten_fallbacks: dict[str, int] = dataclasses.field(default_factory=dict)
    training_graphs: int = 0
    forward_graphs_compiled: int = 0
    backward_graphs_compiled: int = 0
    saved_bytes: int = 0
    graph_cache_hits: int = 0
    graph_cache_misses: int = 0
    graph_cache_stale: int = 0
    kernel_cache_hits: int = 0
    kernel_cache_misses: int = 0
    cache_corrupt: int = 0
    cudagraphs_recorded: int = 0
    cudagraph_memory: dict[str, int] = dataclasses.field(default_factory=dict)
    cudagraph_skips: dict[str, int] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        lines = ["kiln stats:"]
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                lines.append(f"  {f.name:<20} {len(value) if value else 0} kinds")
                for k, v in sorted(value.items()):
                    lines.append(f"    {k:<40} {v}")
            else:
                lines.append(f"  {f.name:<20} {value}")
        return "\n".join(lines)


def _module_counters(module: str):
    try:
        return getattr(importlib.import_module(module), "counters", None)
    except ImportError:
        return None


def _get(counter, key, default=0):
    if counter is None:
        return default
    try:
        return counter.get(key, default)
    except AttributeError:
        return getattr(counter, key, default)


def stats() -> Stats:
    """A snapshot of the counters of kiln, kiln_loopir and kiln_runtime (where
    kiln_codegen_cpp counts its compiles), whichever are installed."""
    loopir = _module_counters("kiln_loopir")
    runtime = _module_counters("kiln_runtime")
    return Stats(
        graphs_compiled=counters["graphs_compiled"],
        graphs_interpreted=counters["graphs_interpreted"],
        kernels_generated=counters["kernels_generated"],
        fused_groups=_get(loopir, "fused_groups"),
        cache_hits=_get(runtime, "disk_cache_hits"),
        cache_misses=_get(runtime, "disk_cache_misses"),
        cpp_compiles=_get(runtime, "cpp_compiles"),  # kiln_codegen_cpp counts there
        eager_fallbacks=counters["eager_fallbacks"],
        interpreter_fallbacks=counters["interpreter_fallbacks"],
        compile_failures={
            k.split(":", 1)[1]: v for k, v in counters.items() if k.startswith("compile_failure:")
        },
        fallback_reasons={
            k.split(":", 1)[1]: v for k, v in counters.items() if k.startswith("eager_fallback:")
        },
        aten_fallbacks={str(k): v for k, v in dict(_get(loopir, "aten_fallbacks", {})).items()},
        training_graphs=counters["training_graphs"],
        forward_graphs_compiled=counters["forward_graphs_compiled"],
        backward_graphs_compiled=counters["backward_graphs_compiled"],
        saved_bytes=counters["saved_bytes"],
        graph_cache_hits=counters["graph_cache_hits"],
        graph_cache_misses=counters["graph_cache_misses"],
        graph_cache_stale=counters["graph_cache_stale"],
        kernel_cache_hits=_per_kind(runtime, "hits", graph=False),
        kernel_cache_misses=_per_kind(runtime, "misses", graph=False),
        cache_corrupt=_get(runtime, "disk_cache_corrupt"),
        **_cudagraph_stats(),
    )


def _per_kind(counter, what: str, *, graph: bool) -> int:
    """Disk-cache ``what`` (hits/misses) of the graph kind, or of every other kind."""
    if counter is None:
        return 0
    prefix = f"disk_cache_{what}:"
    return sum(v for k, v in counter.items()
               if k.startswith(prefix) and (k == prefix + "graph") == graph)


def _cudagraph_stats() -> dict:
    import sys

    cg = sys.modules.get("kiln_runtime.cudagraphs")  # imported only under reduce-overhead
    if cg is None:
        return {}
    recs = cg.recordings()
    return {
        "cudagraphs_recorded": len(recs),
        "cudagraph_memory": {f"{r.runner} [{r.signature}] {r.slot}": r.total_bytes for r in recs},
        "cudagraph_skips": dict(cg.skips),
    }


def reset_stats() -> None:
    """Zero kiln's counters and those of loopir and the runtime."""
    counters.clear()
    for module in ("kiln_loopir", "kiln_runtime"):
        c = _module_counters(module)
        if c is not None:
            c.clear()
    import sys

    cg = sys.modules.get("kiln_runtime.cudagraphs")
    if cg is not None:
        cg.reset()
