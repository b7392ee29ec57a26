"""The compile in progress, for code that runs inside its stages and must say something
about its Artifact: ``record_not_cacheable(reason)`` (e.g. the graph calls bodies of
higher-order operators compiled in this process only: ``kiln.higher_order``) makes the
Artifact unstorable. ``kiln.stages.run`` sets the compile (``compiling``); compiles nested
inside one (a higher-order operator's bodies) run under ``recording_paused()`` or their own
``compiling``. Outside a compile the hooks do nothing. A module of its own so that the stages
and what they call both build on it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

__all__ = ["compiling", "record_not_cacheable", "recording_paused"]

_current: contextvars.ContextVar[Any] = contextvars.ContextVar("kiln_compile", default=None)


def record_not_cacheable(reason: str) -> None:
    """The graph being compiled must not be stored (the first reason given is kept)."""
    c = _current.get()
    if c is not None and c.unstorable is None:
        c.unstorable = reason


@contextlib.contextmanager
def compiling(c: Any) -> Iterator[None]:
    """Hooks called inside report to ``c`` (a ``kiln.stages.Compile``)."""
    token = _current.set(c)
    try:
        yield
    finally:
        _current.reset(token)


@contextlib.contextmanager
def recording_paused() -> Iterator[None]:
    """Compiles inside (a higher-order operator's bodies) report to no compile: they are
    pieces of the graph being compiled, not graphs the cache stores."""
    with compiling(None):
        yield
