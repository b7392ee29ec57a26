"""Lowering families; importing this package registers every lowering in
``kiln_loopir.lowering.lowerings`` (``graph_lowering`` imports it). Families import
``kiln_loopir.lowering`` and lower modules only, never the walker."""

# One registration per op (a second raises): the order does not matter.
from . import (  # noqa: F401
    collectives,
    creation,
    extern,
    fallbacks,
    higher_order,
    indexing,
    norms,
    pointwise,
    pooling,
    random,
    reductions,
    resize,
    scans,
    scatter_reduce,
    special,
    views,
)
