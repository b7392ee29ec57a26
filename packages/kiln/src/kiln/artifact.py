"""``Artifact``: everything needed to run one compiled graph, as a plain picklable record.

The stages (``kiln.stages``) make one; the graph cache (``kiln.cache``) stores and loads
them; ``kiln.assemble`` is the only way from one to a callable. What it holds:

- ``eager_reason``: the stack declined the graph (it runs eagerly), and why; nothing else;
- ``codegen``, ``wrapper_source``, ``entry``, ``kernels``: the generated code;
- ``constants``: where each graph constant comes from (a recipe, ``kiln.constants``), so a
  hit binds the live module's weights instead of the storing process's;
- ``guards``: the weights whose change makes the compiled graph stale (``WeightGuards``);
- ``out_structure`` and ``facts``: the torch-level output structure and what CUDA graphs
  need to know (``kiln.wrappers``);
- ``interpret``: why it runs on loopir's interpreter instead of its kernels, if it does;
- ``unstorable``: why the cache must not keep it, if so.

A fresh compile also has values in memory that a hit derives again (the constants it
computed, kernels it loaded, the version counters it folded from): ``local``, a
``LocalValues``, which pickling drops. ``assemble`` uses what is there and derives what is
missing, so a hit and a miss take the same steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Artifact", "LocalValues", "WeightGuards"]


@dataclasses.dataclass
class WeightGuards:
    """The module tensors a compiled graph depends on, by graph-relative name
    (``kiln.names``): ``computed_from``: constants were computed from them (folded, copied,
    packed: memory, view and version counters are guarded); ``views``: constants alias their
    memory (memory and view guarded); ``modules``: their ``training`` flags guarded;
    ``all_weights``: a stored constant may hold weight values: every weight is guarded."""

    computed_from: tuple[str, ...] = ()
    views: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    all_weights: bool = False

    def __str__(self) -> str:
        parts = [f"{k}={list(v)}" for k, v in (("computed_from", self.computed_from),
                                               ("views", self.views), ("modules", self.modules)) if v]
        parts += ["all_weights"] if self.all_weights else []
        return ", ".join(parts) or "none"


@dataclasses.dataclass
class LocalValues:
    """What a fresh compile holds in memory and a hit derives again (never pickled):
    constant values by buffer name, the loaded kernels' namespace, the error its kernels
    failed to compile with, the version counters its folded constants were computed at,
    guarded objects that have no graph-relative name, and the compile's state (ATen graph,
    schedule) for the interpreter fallback and the profiler."""

    constants: dict[str, Any] = dataclasses.field(default_factory=dict)
    namespace: dict[str, Any] | None = None
    kernel_error: BaseException | None = None
    version_sum: int | None = None
    unnamed_guards: tuple[list, list, list] = ([], [], [])
    state: Any = None


@dataclasses.dataclass
class Artifact:
    """One compiled graph, ready to assemble (module docstring)."""

    eager_reason: str | None = None
    codegen: str = ""
    entry: str = "call"
    wrapper_source: str = ""
    kernels: list = dataclasses.field(default_factory=list)  # kiln_loopir KernelDefs
    constants: dict[str, tuple | None] = dataclasses.field(default_factory=dict)
    guards: WeightGuards = dataclasses.field(default_factory=WeightGuards)
    out_structure: Any = None
    facts: dict = dataclasses.field(default_factory=dict)
    interpret: str | None = None
    unstorable: str | None = None
    stage_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    local: LocalValues | None = dataclasses.field(default=None, compare=False)

    @classmethod
    def eager(cls, reason: str) -> Artifact:
        return cls(eager_reason=reason)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["local"] = None  # values of this process: a hit derives them again
        return state

    def __str__(self) -> str:
        if self.eager_reason is not None:
            return f"Artifact(runs eagerly: {self.eager_reason})"
        lines = [f"Artifact({self.codegen}, entry {self.entry}, {len(self.kernels)} kernels)"]
        if self.interpret:
            lines.append(f"  runs on loopir's interpreter: {self.interpret}")
        if self.unstorable:
            lines.append(f"  not cached: {self.unstorable}")
        if self.stage_seconds:
            lines.append("  stages: " + ", ".join(f"{k} {v * 1e3:.1f} ms"
                                                   for k, v in self.stage_seconds.items()))
        lines.append(f"  guards: {self.guards}")
        for name, recipe in self.constants.items():
            lines.append(f"  constant {name}: {_recipe_text(recipe)}")
        for k in self.kernels:
            lines.append(f"  kernel {k.name}({', '.join(k.arg_names)}): {len(k.source)} chars")
        lines.append("  wrapper:")
        lines += [f"    {line}" for line in self.wrapper_source.splitlines()]
        return "\n".join(lines)


def _recipe_text(recipe: tuple | None) -> str:
    if recipe is None:
        return "its value (no recipe)"
    kind, *rest = recipe
    if kind == "stored":
        t = rest[0]
        return f"stored {tuple(getattr(t, 'shape', ()))} {getattr(t, 'dtype', type(t).__name__)}"
    return f"{kind} {' '.join(map(str, rest))}"
