"""Lowering families; importing this package registers every lowering in
``kiln_loopir.lowering.lowerings``."""

from . import creation, extern, indexing, pointwise, pooling, reductions, views  # noqa: F401
from . import norms, scans, scatter_reduce  # noqa: F401,E402  (H12: after the families they build on)
