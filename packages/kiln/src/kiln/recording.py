"""What one backend call produced, reported by the pipeline's hooks to the graph cache.

``kiln.cache.compile_cached`` runs the pipeline inside ``recording_scope()``; the pipeline's
steps report the generated module (``record_compiled``), the batchnorm fold's recipes
(``record_folded``) or the decision to run eagerly (``record_eager``); outside a scope the hooks
do nothing. A module of its own so that the pipeline and the cache both build on it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

import kiln_runtime

__all__ = ["Recording", "recording_scope", "record_compiled", "record_folded", "record_eager"]


@dataclasses.dataclass
class Recording:
    """What one backend call produced, reported by the pipeline's hooks."""

    compiled: list[tuple[Any, Any, Any]] = dataclasses.field(default_factory=list)
    eager_reason: str | None = None
    folded: dict[str, tuple] = dataclasses.field(default_factory=dict)
    not_cacheable: str | None = None


_recording: contextvars.ContextVar[Recording | None] = contextvars.ContextVar(
    "kiln_cache_recording", default=None
)


def record_compiled(aten_gm, module, compiled) -> None:
    """Hook in ``kiln.backend.compile_aten``: the generated module behind a compiled graph."""
    rec = _recording.get()
    if rec is None:
        return
    if not isinstance(compiled, kiln_runtime.CompiledGraph):
        rec.not_cacheable = "its kernels did not compile (interpreter fallback)"
    rec.compiled.append((aten_gm, module, compiled))


def record_folded(recipes: dict[str, tuple] | None) -> None:
    """Hook in ``kiln.backend.compile_inference``: the buffers ``fold_conv_batchnorm`` computed, each with
    its recipe (``kiln.passes.folded_value``'s arguments by qualified name)."""
    rec = _recording.get()
    if rec is not None and recipes:
        rec.folded.update(recipes)


def record_eager(reason: str) -> None:
    """Hook in ``kiln.wrappers.run_eagerly``: the graph runs eagerly, and why."""
    rec = _recording.get()
    if rec is not None:
        rec.eager_reason = reason


@contextlib.contextmanager
def recording_scope() -> Iterator[Recording]:
    """Record what the pipeline produces inside (the graph cache stores it)."""
    rec = Recording()
    token = _recording.set(rec)
    try:
        yield rec
    finally:
        _recording.reset(token)
