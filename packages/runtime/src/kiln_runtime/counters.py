"""Process-wide counters of the runtime (read by ``kiln.stats()``)."""

from __future__ import annotations

from collections import Counter

#: ``disk_cache_hits`` / ``disk_cache_misses`` / ``disk_cache_corrupt``: on-disk cache lookups;
#: ``wrappers_loaded``: generated wrappers exec'd by ``load``.
counters: Counter[str] = Counter()


def reset_counters() -> None:
    counters.clear()
