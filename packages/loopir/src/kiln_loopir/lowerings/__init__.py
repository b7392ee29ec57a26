"""Lowering families; importing this package registers every lowering in
``kiln_loopir.lowering.lowerings``."""

from . import creation, extern, indexing, pointwise, pooling, reductions, views  # noqa: F401
