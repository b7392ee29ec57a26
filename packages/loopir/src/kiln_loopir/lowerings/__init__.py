"""Lowering families; importing this package registers every lowering in
``kiln_loopir.lowering.lowerings``."""

# Order matters where a later module overrides an op (scatter_reduce after indexing, resize
# after pooling): the later registration wins.
from . import (  # noqa: F401
    creation,
    extern,
    indexing,
    norms,
    pointwise,
    pooling,
    reductions,
    resize,
    scans,
    scatter_reduce,
    special,
    views,
)
