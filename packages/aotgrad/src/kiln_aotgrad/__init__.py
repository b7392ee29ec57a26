"""kiln-aotgrad: ATen-level tracing of torch-level FX graphs.

- ``trace_inference(gm, example_inputs)``: a functional ATen graph, decomposed to CORE_OPS
  (docs/ops.md), input mutations written back with ``copy_`` at the end (docs/aotgrad.md).
- ``trace_joint(gm, example_inputs)``: one functional ATen graph of forward and backward;
  ``partition(joint)`` cuts it into a forward and a backward graph (min-cut, or save-all);
  ``compile_joint(gm, example_inputs, fw_compiler, bw_compiler)`` runs the compiled pair
  inside one ``torch.autograd.Function`` (docs/training.md).
- ``core_decompositions()``: the decomposition table; ``CORE_OPS``: the op set it leaves.
"""

from .core_ops import CORE_OP_GROUPS, CORE_OPS, is_core_op
from .decompositions import FUNCTION_RULES, KEEP, core_decompositions
from .flex_attention import flex_attention_dense  # noqa: F401  (registers its rule)
from .inference import (
    AliasedInputMutationError,
    InferenceInfo,
    non_core_ops,
    restore_outputs,
    trace_inference,
)
from .joint import JointGraph, MutatedGradInputError, trace_joint
from .partition import PARTITIONERS, RECOMPUTABLE, Partition, partition
from .runtime import CompiledJoint, DoubleBackwardError, aot_eager_compiler, compile_joint

__all__ = [
    "trace_inference",
    "trace_joint",
    "partition",
    "compile_joint",
    "aot_eager_compiler",
    "JointGraph",
    "Partition",
    "CompiledJoint",
    "PARTITIONERS",
    "RECOMPUTABLE",
    "DoubleBackwardError",
    "MutatedGradInputError",
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
