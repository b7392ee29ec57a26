"""The garbage collector while a frame compiles: ``user_heap_frozen()``.

Converting a frame allocates around a million short-lived objects (FX nodes, fake tensors,
SymPy expressions). Each gen-2 collection they trigger scans the whole heap, the program's
objects and its models' included: 0.16-0.3 s per collection on CPU with four models
loaded, on the compile's critical path. ``gc.freeze()`` moves every object that existed
before the compile to the permanent generation for its duration, so those collections scan
what the compile made; ``gc.unfreeze()`` returns them at the end. Garbage the compile makes
is still collected.

Nested and concurrent compiles share one freeze (a depth count). A program that froze
objects itself (e.g. before forking workers) or turned the collector off is left as it is:
unfreezing would hand back its objects too. A program's own freeze holds its whole heap,
hundreds of thousands of objects once torch is loaded; CPython 3.12's collector also moves
the interpreter's immortal objects (a few hundred) to the permanent generation by itself, so
a count below ``PROGRAM_FREEZE_MIN`` is the interpreter's, not the program's.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

#: fewer frozen objects than this are the interpreter's own (3.12: 375 immortal objects)
PROGRAM_FREEZE_MIN = 10_000

_lock = threading.Lock()
_depth = 0
_froze = False  # whether the outermost compile froze the heap (and so unfreezes it)


@contextlib.contextmanager
def user_heap_frozen() -> Iterator[None]:
    global _depth, _froze
    with _lock:
        if _depth == 0:
            _froze = gc.isenabled() and gc.get_freeze_count() < PROGRAM_FREEZE_MIN
            if _froze:
                gc.freeze()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _froze:
                gc.unfreeze()
                _froze = False


def compile_froze_the_heap() -> bool:
    """Whether a compile now in progress froze the heap (``gc.get_referrers`` does not scan
    frozen objects: a pass that needs them unfreezes for the call and freezes again)."""
    return _froze
