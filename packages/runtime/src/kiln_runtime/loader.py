"""``load``: turn a generated module (wrapper source + loaded kernels) into a callable."""

from __future__ import annotations

import hashlib
import linecache
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch

from . import compile_timer
from .counters import counters
from .launch import HELPERS


class ModuleLike(Protocol):
    """What ``load`` reads from a generated module.

    kiln_loopir's ``GeneratedModule`` fits: ``wrapper_source`` (Python source defining
    ``call(args) -> list[Tensor]``), ``build_namespace()`` (kernels' loaded callables, graph
    constants: the names the source uses but does not import) and ``entry`` (default
    ``"call"``). Plain objects with ``source`` and ``namespace`` attributes work too.
    """

    wrapper_source: str

    def build_namespace(self) -> Mapping[str, Any]: ...


def _source_and_namespace(module) -> tuple[str, Mapping[str, Any], str]:
    source = getattr(module, "wrapper_source", None)
    if source is None:
        source = module.source
    build = getattr(module, "build_namespace", None)
    namespace = build() if callable(build) else (getattr(module, "namespace", None) or {})
    return source, namespace, getattr(module, "entry", None) or "call"


class CompiledGraph:
    """``compiled(*inputs) -> list[Tensor]``; ``.source`` is the wrapper, ``.call`` its entry."""

    __slots__ = ("call", "source", "filename", "module", "__weakref__")

    def __init__(self, call: Callable, source: str, filename: str, module: Any):
        self.call = call
        self.source = source
        self.filename = filename
        self.module = module

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        return self.call(list(inputs))

    def __repr__(self) -> str:
        return f"<CompiledGraph {self.filename}>"


def load(module: ModuleLike, config: Any = None) -> CompiledGraph:
    """Exec the module's wrapper source with its namespace (kernels are compiled/loaded when
    the namespace is built) plus the launch helpers (``launch.HELPERS``), and return its
    ``call`` wrapped so that ``compiled(*inputs)`` works. The source is registered with ``linecache`` so tracebacks show its lines."""
    with compile_timer.phase("kernel compile"):  # the codegen compiles/loads its kernels here
        source, extra, entry = _source_and_namespace(module)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    filename = f"<kiln-wrapper-{digest}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": f"kiln_wrapper_{digest}", "torch": torch}
    namespace.update(HELPERS)
    namespace.update(extra)
    with compile_timer.phase("wrapper exec"):
        exec(compile(source, filename, "exec"), namespace)
    call = namespace.get(entry)
    if not callable(call):
        raise ValueError(f"generated wrapper {filename} defines no {entry}(args) function")
    counters["wrappers_loaded"] += 1
    return CompiledGraph(call, source, filename, module)
