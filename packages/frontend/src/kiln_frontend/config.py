"""kiln-frontend's settings: plain module attributes, read at the moment they are used.

Set them in code (``kiln_frontend.config.cache_size_limit = 16``) or, for some, through
environment variables read once at import:

==========================  =======================  ======================================
attribute                   env var                  meaning
==========================  =======================  ======================================
``debug``                   ``KILN_DEBUG=1``         print each captured graph (table),
                                                     ORIGINAL/MODIFIED BYTECODE and GUARDS,
                                                     and each frame skipped and why
``log_recompiles``          ``KILN_LOGS=recompiles`` print why a frame is compiled again
``verbose``                 ``KILN_VERBOSE=1``       full tracebacks in suppressed-error
                                                     warnings; more logging
``suppress_errors``         ``KILN_SUPPRESS_ERRORS`` a failing backend / capture warns once
                            (``0`` turns it off)     and the frame runs eagerly (True), or
                                                     the error propagates (False)
``cache_size_limit``        ``KILN_CACHE_SIZE_LIMIT`` cache entries per code object before
                                                     the frame runs eagerly for good (8)
==========================  =======================  ======================================

``KILN_LOGS`` is a comma-separated list; besides ``recompiles`` it accepts ``graph_breaks``
(``log_graph_breaks``), ``guards`` (``log_guards``) and ``+all`` / ``all``.

``skip_stdlib``: frames of the standard library's own modules are never captured (True).

``capture_scalar_outputs``: whether ``t.item()``, ``float(t)`` and ``int(t)`` enter the graph
as unbacked symbols. ``None`` (the default): only under ``fullgraph=True``, which must give
one graph; otherwise they graph-break, as torch.compile does by default, so that a backend
that cannot compile a number read out of a tensor still compiles the graphs on both sides.
``True``: always; ``False``: never (``fullgraph`` then raises).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return default


def _kiln_logs() -> set[str]:
    raw = os.environ.get("KILN_LOGS", "")
    return {part.strip().lstrip("+").lower() for part in raw.split(",") if part.strip()}


_LOGS = _kiln_logs()

debug: bool = _env_flag("KILN_DEBUG", False)
verbose: bool = _env_flag("KILN_VERBOSE", False)
suppress_errors: bool = _env_flag("KILN_SUPPRESS_ERRORS", True)
cache_size_limit: int = _env_int("KILN_CACHE_SIZE_LIMIT", 8)
log_recompiles: bool = "recompiles" in _LOGS or "all" in _LOGS
log_graph_breaks: bool = "graph_breaks" in _LOGS or "all" in _LOGS
log_guards: bool = "guards" in _LOGS or "all" in _LOGS
skip_stdlib: bool = True
capture_scalar_outputs: bool | None = None

_NAMES = (
    "debug",
    "verbose",
    "suppress_errors",
    "cache_size_limit",
    "log_recompiles",
    "log_graph_breaks",
    "log_guards",
    "skip_stdlib",
    "capture_scalar_outputs",
)


def get_config() -> dict[str, Any]:
    """The current settings as a dict."""
    g = globals()
    return {name: g[name] for name in _NAMES}


@contextlib.contextmanager
def patch(**changes: Any) -> Iterator[None]:
    """Temporarily change settings: ``with config.patch(cache_size_limit=2): ...``."""
    g = globals()
    unknown = sorted(set(changes) - set(_NAMES))
    if unknown:
        raise AttributeError(f"kiln_frontend.config has no setting(s) {unknown}; known: {list(_NAMES)}")
    saved = {name: g[name] for name in changes}
    g.update(changes)
    try:
        yield
    finally:
        g.update(saved)
