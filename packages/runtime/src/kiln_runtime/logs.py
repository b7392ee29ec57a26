"""``KILN_LOGS``: which of kiln's optional log channels are on.

The frontend reads the same variable for its own channels (``recompiles``, ``graph_breaks``,
...); the compiler packages read theirs (``perf``: where compile time goes and what each
generated kernel costs) through ``log_enabled`` so that one place parses it.
"""

from __future__ import annotations

import os

__all__ = ["enabled_channels", "log_enabled"]


def enabled_channels() -> frozenset[str]:
    """The channels named in ``$KILN_LOGS`` (comma-separated, a leading ``+`` ignored)."""
    raw = os.environ.get("KILN_LOGS", "")
    return frozenset(part.strip().lstrip("+") for part in raw.split(",") if part.strip())


def log_enabled(channel: str) -> bool:
    """Whether ``channel`` (e.g. ``"perf"``) is on; read at each call, so tests can set it."""
    return channel in enabled_channels()
