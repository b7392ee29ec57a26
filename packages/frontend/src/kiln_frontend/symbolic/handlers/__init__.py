"""Opcode handlers, one module per family.  Importing this package registers them all."""

from . import (  # noqa: F401
    arithmetic,
    calls,
    compare_jumps,
    containers,
    exceptions,
    loads_stores,
    match,
    returns,
    stack,
)
