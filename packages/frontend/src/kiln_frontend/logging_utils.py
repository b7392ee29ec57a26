"""Loggers and one-time warnings of kiln-frontend.

Loggers (standard :mod:`logging`, no handlers installed by us):

- ``kiln`` — the parent.
- ``kiln.recompiles`` — why a frame is compiled again (its first failing guard).
- ``kiln.graph_breaks`` — graph breaks and their reasons.
- ``kiln.guards`` — the guards of each new cache entry.
- ``kiln.skips`` — frames not captured because of where their code lives, and why
  (printed with ``config.debug`` / ``KILN_DEBUG=1``).
- ``kiln.internal_errors`` — kiln's own failures while capturing a frame (always printed).

``emit(logger_name, message, *, show)`` logs the message at INFO and, when ``show`` is true
(``config.log_recompiles`` etc., i.e. ``KILN_LOGS=recompiles``), also prints it to stderr, so
the env var works without any logging setup.  ``warn_once(key, message)`` issues a
``KilnWarning`` once per key until ``reset_warnings()`` (called by ``kiln_frontend.reset()``).
"""

from __future__ import annotations

import collections
import logging
import sys
import warnings
from collections.abc import Hashable

LOG_ROOT = "kiln"
RECOMPILES = "kiln.recompiles"
GRAPH_BREAKS = "kiln.graph_breaks"
GUARDS = "kiln.guards"
SKIPS = "kiln.skips"
INTERNAL_ERRORS = "kiln.internal_errors"

#: Event counts since the last ``kiln_frontend.reset()``: "frames" the eval-frame callback
#: saw, "skipped" (never-captured files), "converts" (convert_frame calls), "compiles" (cache
#: entries made), "recompiles" (misses on a code that had entries), "cache_limit" hits,
#: suppressed "failures", "internal_errors" (kiln's own bugs while capturing; see convert.py).
#: Here, below both, so convert.py counts without importing eval_frame (``eval_frame.counters``
#: is this object).
counters: collections.Counter[str] = collections.Counter()


class KilnWarning(UserWarning):
    """A warning from kiln-frontend (failed compile fell back to eager, cache limit hit)."""


def get_logger(name: str = LOG_ROOT) -> logging.Logger:
    return logging.getLogger(name)


def emit(logger_name: str, message: str, *, show: bool = False) -> None:
    """Log ``message`` on ``logger_name``; also print it to stderr when ``show``."""
    get_logger(logger_name).info(message)
    if show:
        print(f"[{logger_name}] {message}", file=sys.stderr, flush=True)


_warned: set[Hashable] = set()


def warn_once(key: Hashable, message: str, *, stacklevel: int = 2) -> bool:
    """Warn with ``message`` the first time ``key`` is seen; returns whether it warned."""
    if key in _warned:
        return False
    _warned.add(key)
    get_logger().info(message)  # warnings.warn below is what the user sees
    warnings.warn(message, KilnWarning, stacklevel=stacklevel + 1)
    return True


def reset_warnings() -> None:
    _warned.clear()


__all__ = [
    "GRAPH_BREAKS",
    "GUARDS",
    "INTERNAL_ERRORS",
    "KilnWarning",
    "LOG_ROOT",
    "RECOMPILES",
    "SKIPS",
    "emit",
    "get_logger",
    "reset_warnings",
    "warn_once",
]
