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
      says why: training path not built, aliased input mutation, ...);
    - ``interpreter_fallbacks``: graphs whose kernels did not compile, run on loopir's
      interpreter instead;
    - ``aten_fallbacks``: ops loopir ran through the aten fallback, by op name.
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
    fallback_reasons: dict[str, int] = dataclasses.field(default_factory=dict)
    aten_fallbacks: dict[str, int] = dataclasses.field(default_factory=dict)

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
        fallback_reasons={
            k.split(":", 1)[1]: v for k, v in counters.items() if k.startswith("eager_fallback:")
        },
        aten_fallbacks={str(k): v for k, v in dict(_get(loopir, "aten_fallbacks", {})).items()},
    )


def reset_stats() -> None:
    """Zero kiln's counters and those of loopir and the runtime."""
    counters.clear()
    for module in ("kiln_loopir", "kiln_runtime"):
        c = _module_counters(module)
        if c is not None:
            c.clear()
