"""Codegens as plug-ins: the entry-point group ``kiln.codegens``.

A codegen package declares, in its pyproject.toml::

    [project.entry-points."kiln.codegens"]
    triton = "kiln_codegen_triton.plugin:CODEGEN"

where ``CODEGEN`` is a ``CodegenEntry``: its name, the device types it generates code for,
its "kernel did not compile" error class (callers run the graph on loopir's interpreter when
it is raised) and ``build(options)`` making a fresh codegen from the caller's options object
(read with ``getattr``; each codegen picks the fields it knows). Nothing in loopir or ``kiln``
names a particular codegen.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ENTRY_POINT_GROUP",
    "CodegenEntry",
    "CodegenUnavailable",
    "codegen_names",
    "get_codegen",
    "codegen_for_device_type",
    "loadable_codegens",
    "compile_errors",
    "register_codegen",
]

ENTRY_POINT_GROUP = "kiln.codegens"


@dataclass(frozen=True)
class CodegenEntry:
    """One registered codegen (see the module docstring)."""

    name: str
    devices: tuple[str, ...]
    compile_error: type[BaseException]
    build: Callable[[Any], Any]
    priority: int = 0  # among codegens for one device type, the highest is the default
    #: its kernels implement the philox random ops (ops.rand/randn/randint64): random ops are
    #: lowered to them where it is the codegen (kiln_loopir.lowerings.random)
    philox: bool = False
    #: ``prepare(graph_nodes)``, called as soon as a graph for it arrives, before tracing: a
    #: codegen starts what is slow to start (Triton's compile workers) while the graph is
    #: traced, lowered and scheduled
    prepare: Callable[[int], None] | None = None
    #: ``toolchain() -> str``: the versions of the tools its kernels are built with (compiler,
    #: Triton); part of every graph cache key, so a new toolchain recompiles
    toolchain: Callable[[], str] | None = None
    #: ``synchronize()``: waits for the kernels its device has queued (None where a kernel
    #: call returns when it is done); the profiler's clock calls it around each launch
    synchronize: Callable[[], None] | None = None

    def __str__(self) -> str:
        return (f"codegen {self.name} devices {', '.join(self.devices)} "
                f"compile error {self.compile_error.__name__}")


class CodegenUnavailable(RuntimeError):
    """A codegen is declared (entry point) but its package cannot be loaded here."""


_registered: dict[str, CodegenEntry] = {}
_loaded: dict[str, CodegenEntry] = {}
_unavailable: dict[str, CodegenUnavailable] = {}  # import failures, reported once per process


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in found and found[ep.name].value != ep.value:
            raise RuntimeError(f"two packages declare codegen {ep.name!r}: "
                               f"{found[ep.name].value} and {ep.value}")
        found[ep.name] = ep
    return found


def register_codegen(entry: CodegenEntry) -> CodegenEntry:
    """Register a codegen in this process (tests, out-of-tree experiments); a name already
    taken raises."""
    if entry.name in _registered or entry.name in _entry_points():
        raise ValueError(f"codegen {entry.name!r} is already registered")
    _registered[entry.name] = entry
    return entry


def codegen_names() -> list[str]:
    """Every known codegen name (entry points and ``register_codegen``), sorted."""
    return sorted(set(_entry_points()) | set(_registered))


def get_codegen(name: str) -> CodegenEntry:
    """The ``CodegenEntry`` called ``name``. An unknown name raises ``ValueError`` listing the
    known ones; a declared codegen whose package fails to import raises
    ``CodegenUnavailable`` naming it."""
    if name in _registered:
        return _registered[name]
    if name in _loaded:
        return _loaded[name]
    if name in _unavailable:
        raise _unavailable[name]
    eps = _entry_points()
    if name not in eps:
        raise ValueError(f"unknown codegen {name!r}; known codegens: {', '.join(codegen_names())}")
    try:
        entry = eps[name].load()
    except Exception as e:
        _unavailable[name] = CodegenUnavailable(
            f"codegen {name!r} ({eps[name].value}) is declared but not available: {e}")
        raise _unavailable[name] from e
    if not isinstance(entry, CodegenEntry) or entry.name != name:
        raise TypeError(f"entry point {name} = {eps[name].value} is not a CodegenEntry named {name!r}")
    _loaded[name] = entry
    return entry


def codegen_for_device_type(device_type: str) -> CodegenEntry:
    """The default codegen for a device type (``"cpu"``, ``"cuda"``): the loadable codegen
    declaring it with the highest priority."""
    candidates, problems = [], []
    for name in codegen_names():
        try:
            entry = get_codegen(name)
        except CodegenUnavailable as e:
            problems.append(str(e))
            continue
        if device_type in entry.devices:
            candidates.append(entry)
    if not candidates:
        why = f" ({'; '.join(problems)})" if problems else ""
        raise CodegenUnavailable(
            f"no codegen for device {device_type!r}; known codegens: {', '.join(codegen_names())}{why}")
    return max(candidates, key=lambda e: e.priority)


def loadable_codegens() -> list[CodegenEntry]:
    """Every registered codegen whose package loads here, by name."""
    out = []
    for name in codegen_names():
        try:
            out.append(get_codegen(name))
        except (CodegenUnavailable, TypeError):
            continue
    return out


def compile_errors() -> tuple[type[BaseException], ...]:
    """The compile-error classes of every loadable codegen (for the interpreter fallback)."""
    return tuple(entry.compile_error for entry in loadable_codegens())
