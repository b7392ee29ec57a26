"""kiln-aotgrad: ATen-level tracing of torch-level FX graphs.

- ``trace_inference(gm, example_inputs)``: a functional ATen graph, decomposed to CORE_OPS
  (docs/ops.md), input mutations written back with ``copy_`` at the end (docs/aotgrad.md).
- ``core_decompositions()``: the decomposition table; ``CORE_OPS``: the op set it leaves.
"""

from .core_ops import CORE_OP_GROUPS, CORE_OPS, is_core_op
from .decompositions import FUNCTION_RULES, KEEP, core_decompositions
from .inference import (
    AliasedInputMutationError,
    InferenceInfo,
    non_core_ops,
    restore_outputs,
    trace_inference,
)

__all__ = [
    "trace_inference",
    "core_decompositions",
    "CORE_OPS",
    "CORE_OP_GROUPS",
    "KEEP",
    "FUNCTION_RULES",
    "is_core_op",
    "non_core_ops",
    "restore_outputs",
    "InferenceInfo",
    "AliasedInputMutationError",
]
