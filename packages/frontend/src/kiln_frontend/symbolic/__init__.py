"""The symbolic interpreter: bytecode -> FX graph, with variable trackers.

* ``translator``: ``InstructionTranslator`` (the frame) and ``InliningInstructionTranslator``
  (called user functions);
* ``handlers/``: one module per opcode family, registered with ``registry.handler``;
* ``variables/``: the trackers, registered with ``variables.tracker_for``;
* ``output_graph``: the FX graph, its inputs, guards and the backend call;
* ``codegen``: bytecode that rebuilds tracked values in the transformed code.

Importing this package imports every layer (kiln_frontend/layers.py), so the opcode handlers,
the higher-order operators' entries and the names lower layers reach through ``upper`` are all
registered before anything is traced.
"""

from .. import shapes  # noqa: F401  (a tracker layer outside this package: SymNodeVariable)
from . import (
    handlers,  # noqa: F401  (registers the opcode handlers)
    variables,  # noqa: F401  (registers the trackers)
)
from .hops import (  # noqa: F401  (register the higher-order operators' entries)
    autograd_function,
    checkpoint,
    control_flow,
    flex_attention,
    map_scan,
)
from .output_graph import OutputGraph
from .registry import handler, lookup
from .translator import (
    InliningInstructionTranslator,
    InstructionTranslator,
    InstructionTranslatorBase,
    RefusalRestart,
    RequiresGradRestart,
    RestartAnalysis,
)

__all__ = [
    "InstructionTranslator",
    "InstructionTranslatorBase",
    "InliningInstructionTranslator",
    "OutputGraph",
    "RefusalRestart",
    "RequiresGradRestart",
    "RestartAnalysis",
    "handler",
    "lookup",
]
